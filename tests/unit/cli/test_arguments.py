"""Options that take units (`64MiB`, `7d`) and entry ids: what does not parse is a usage
error (exit code 2) before anything connects."""

from __future__ import annotations

import json

import pytest

from stream.cli.main import build_parser
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
