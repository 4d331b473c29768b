"""Options that take units (`64MiB`, `7d`) and entry ids: what does not parse is a usage
error (exit code 2) before anything connects."""

from __future__ import annotations

import datetime
import json
import time

import pytest

from stream.cli.arguments import join_dash_values
from stream.cli.main import DASH_VALUE_OPTIONS, build_parser
from tests.unit.cli.conftest import Streamctl


def _usage_error(*argv: str) -> bool:
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(list(argv))
    return refused.value.code == 2


def test_from_is_an_int64_entry_id() -> None:
    largest = str((1 << 63) - 1)
    assert build_parser().parse_args(["tail", "s", "--from", largest]).start == (1 << 63) - 1
    assert build_parser().parse_args(["tail", "s", "--from", "earliest"]).start == "earliest"
    assert _usage_error("tail", "s", "--from", str(1 << 63))
    assert _usage_error("tail", "s", "--from", "-1")
    assert _usage_error("tail", "s", "--from", "first")
    assert _usage_error("trim", "s", "--before", str(1 << 64))


def test_max_entries_is_positive() -> None:
    assert build_parser().parse_args(["tail", "s", "--max-entries", "3"]).max_entries == 3
    assert build_parser().parse_args(["tail", "s"]).max_entries is None
    assert _usage_error("tail", "s", "--max-entries", "0")


def test_byte_options_take_units() -> None:
    args = build_parser().parse_args(
        ["create", "s", "--fragment-max-bytes", "64MiB", "--retention-max-bytes", "10GB"]
    )
    assert (args.fragment_max_bytes, args.retention_max_bytes) == (64 << 20, 10 * 1000**3)
    assert build_parser().parse_args(["create", "s"]).fragment_max_bytes == 64 << 20
    tail = build_parser().parse_args(["bench", "tail", "--total-bytes", "4MiB",
                                      "--entry-size", "4KiB"])  # fmt: skip
    assert (tail.total_bytes, tail.entry_size) == (4 << 20, 4 << 10)
    append = build_parser().parse_args(["bench", "append", "--sizes", "100,1KiB"])
    assert append.sizes == [100, 1024]
    assert _usage_error("create", "s", "--fragment-max-bytes", "64 parsecs")


def test_create_takes_the_units_of_retention_set(
    streamctl: Streamctl, capsys: pytest.CaptureFixture[str]
) -> None:
    quorum = ("--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1")
    limits = ("--retention-max-age", "7d", "--retention-max-bytes", "10GiB")
    assert (
        streamctl(
            "create", "--allow-fewer-bookies", "kept", *quorum, *limits, "--fragment-max-age", "90m"
        )
        == 0
    )
    capsys.readouterr()
    assert streamctl("retention", "show", "kept", "--output", "json") == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["max_age_s"], report["max_bytes"]) == (7 * 86400, 10 << 30)
    assert _usage_error("create", "s", "--retention-max-age", "7 fortnights")


def _from_time(*value: str) -> int:
    argv = ["tail", "s", "--from-time", *value]
    return build_parser().parse_args(join_dash_values(argv, DASH_VALUE_OPTIONS)).start_time_ms


def test_from_time_takes_iso_8601_utc_by_default() -> None:
    ten = int(datetime.datetime(2026, 11, 24, 10, tzinfo=datetime.UTC).timestamp() * 1000)
    assert _from_time("2026-11-24T10:00Z") == ten
    assert _from_time("2026-11-24T10:00") == ten  # no offset: UTC
    assert _from_time("2026-11-24T12:00:00+02:00") == ten
    assert _from_time("2026-11-24T10:00:00.250Z") == ten + 250
    assert build_parser().parse_args(["tail", "s"]).start_time_ms is None


def test_from_time_takes_a_time_before_now() -> None:
    before = time.time_ns() // 1_000_000
    hour_ago = _from_time("-1h")
    after = time.time_ns() // 1_000_000
    assert before - 3_600_000 <= hour_ago <= after - 3_600_000
    week_ago = _from_time("-7d")
    assert before - 7 * 86_400_000 <= week_ago <= time.time_ns() // 1_000_000 - 7 * 86_400_000
    written_with_equals = build_parser().parse_args(["tail", "s", "--from-time=-90m"])
    assert written_with_equals.start_time_ms <= time.time_ns() // 1_000_000 - 90 * 60_000


def test_bad_from_time_is_a_usage_error(streamctl: Streamctl) -> None:
    for bad in ("yesterday", "-1x", "-", "2026-13-01T00:00Z", "-0s", "1969-12-31T00:00Z"):
        argv = join_dash_values(["tail", "s", "--from-time", bad], DASH_VALUE_OPTIONS)
        assert _usage_error(*argv), bad
    # Either an entry position or a time, not both; no stream is looked up before that.
    assert _usage_error("tail", "s", "--from", "earliest", "--from-time", "2026-11-24T10:00Z")
    assert streamctl("tail", "nosuch", "--from-time", "-1x") == 2


def test_dash_values_are_joined_only_for_their_options() -> None:
    argv = ["tail", "s", "--from-time", "-1h", "--timeout", "1"]
    assert join_dash_values(argv, ("--from-time",)) == [
        "tail", "s", "--from-time=-1h", "--timeout", "1",
    ]  # fmt: skip
    assert join_dash_values(["tail", "--from-time", "--timeout"], ("--from-time",)) == [
        "tail", "--from-time", "--timeout",
    ]  # fmt: skip
    assert join_dash_values(["tail", "--from-time"], ("--from-time",)) == ["tail", "--from-time"]
