"""The pure parts of the connector: option parsing, range splitting, read limits, offsets."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from pyspark.sql.types import StructType

from spark_connector import StreamkeeperDataSource
from spark_connector.catalog import StreamBounds
from spark_connector.entry_sizes import (
    DEFAULT_ENTRY_BYTES,
    EntrySizes,
    whole_fragment_bytes,
)
from spark_connector.errors import ConnectorOptionError
from spark_connector.options import parse_sink_options, parse_source_options
from spark_connector.ranges import (
    Offsets,
    StreamRange,
    at_least,
    limit_offsets,
    ordered,
    split_range,
)

pytestmark = pytest.mark.spark

META = {"metadata": "127.0.0.1:2181/streamkeeper"}


def test_split_range_cuts_at_fragments_and_size() -> None:
    assert split_range(0, 9, [0], 4) == [(0, 3), (4, 7), (8, 9)]
    assert split_range(3, 12, [0, 5, 10], 100) == [(3, 4), (5, 9), (10, 12)]
    assert split_range(5, 4, [0], 10) == []
    pieces = split_range(17, 1234, [0, 100, 250, 900], 64)
    covered = [i for lo, hi in pieces for i in range(lo, hi + 1)]
    assert covered == list(range(17, 1235))
    assert all(hi - lo < 64 for lo, hi in pieces)


def test_at_least_cuts_the_largest_pieces_evenly_and_keeps_their_order() -> None:
    assert at_least([("a", 0, 9)], 3) == [("a", 0, 3), ("a", 4, 6), ("a", 7, 9)]
    assert at_least([("a", 0, 99), ("b", 0, 9)], 4) == [
        ("a", 0, 33),
        ("a", 34, 66),
        ("a", 67, 99),
        ("b", 0, 9),
    ]
    assert at_least([("a", 5, 6), ("b", 0, 0)], 10) == [("a", 5, 5), ("a", 6, 6), ("b", 0, 0)]
    assert at_least([("a", 0, 9), ("b", 0, 9)], 1) == [("a", 0, 9), ("b", 0, 9)]
    assert at_least([], 5) == []
    pieces = [("a", 0, 999), ("a", 1000, 1049), ("b", 7, 306)]
    sizes = [1000, 50, 300]
    for count in (1, 2, 3, 4, 17, 100, 1349, 1350, 5000):
        cut = at_least(pieces, count)
        assert len(cut) == max(3, min(count, 1350))
        assert [(k, i) for k, lo, hi in cut for i in range(lo, hi + 1)] == [
            (k, i) for k, lo, hi in pieces for i in range(lo, hi + 1)
        ]
        # Oracle: the smallest largest part of len(cut) parts (s such that the pieces cut
        # into parts of at most s entries make at most that many parts).
        best = next(s for s in range(1, 1001) if sum(-(-n // s) for n in sizes) <= len(cut))
        assert max(hi - lo + 1 for _, lo, hi in cut) == best


def test_limit_offsets_shares_the_budget_and_never_passes_latest() -> None:
    assert limit_offsets({"a": 0, "b": 0}, {"a": 100, "b": 100}, 50) == {"a": 25, "b": 25}
    assert limit_offsets({"a": 0, "b": 95}, {"a": 100, "b": 100}, 50) == {"a": 45, "b": 100}
    assert limit_offsets({"a": 7}, {"a": 9}, 1000) == {"a": 9}
    for budget in range(1, 40):
        end = limit_offsets({"a": 3, "b": 0, "c": 10}, {"a": 13, "b": 2, "c": 30}, budget)
        assert sum(end.values()) - 13 == min(budget, 32)


def test_entry_sizes_use_fragment_bytes_where_known_and_the_estimate_elsewhere() -> None:
    sizes = EntrySizes.of([(0, 9, 1000), (20, 29, 100)], sampled=None)
    assert sizes.estimate == 55.0  # 1100 bytes over 20 known entries
    assert sizes.entries_within(0, 100, 1000) == (10, 1000.0)  # 100 bytes each
    assert sizes.entries_within(5, 100, 549) == (5, 500.0)
    assert sizes.entries_within(8, 100, 200 + 55 * 3) == (5, 365.0)  # two known, three estimated
    assert sizes.entries_within(20, 100, 10_000) == (100, 10 * 10 + 90 * 55.0)
    assert sizes.entries_within(0, 4, 10**9) == (4, 400.0)
    assert sizes.entries_within(0, 100, 99) == (0, 0.0)
    assert EntrySizes.of([], sampled=300.0).entries_within(7, 50, 1000) == (3, 900.0)
    assert EntrySizes.of([], sampled=None).estimate == DEFAULT_ENTRY_BYTES
    # Empty payloads still count a byte each.
    assert EntrySizes.of([(0, 99, 0)], sampled=None).entries_within(0, 1000, 40) == (40, 40.0)


def test_only_fragments_one_term_filled_count_their_recorded_bytes() -> None:
    fragments = [(0, 99, 5000), (100, 199, 700), (200, 299, 5000), (300, None, None)]
    # Term 2 took over in the middle of the second fragment: its bytes are partial.
    assert whole_fragment_bytes(fragments, [0, 150]) == ((0, 99, 5000), (200, 299, 5000))
    assert whole_fragment_bytes(fragments, [0, 200]) == (
        (0, 99, 5000),
        (100, 199, 700),
        (200, 299, 5000),
    )
    # Term starts older than the list's first are unknown: older fragments do not count.
    assert whole_fragment_bytes(fragments, [120, 250]) == ()
    assert whole_fragment_bytes(fragments, [100]) == ((100, 199, 700), (200, 299, 5000))
    assert whole_fragment_bytes(fragments, []) == ()


def test_limit_offsets_with_a_byte_bound_shares_bytes_and_keeps_the_entry_bound() -> None:
    sizes = {"a": EntrySizes.of([], 100.0), "b": EntrySizes.of([], 10.0)}
    start, latest = {"a": 0, "b": 0}, {"a": 1000, "b": 1000}
    assert limit_offsets(start, latest, None, 2000, sizes) == {"a": 10, "b": 100}
    both = limit_offsets(start, latest, 50, 2000, sizes)
    assert both["a"] + both["b"] == 50 and both["a"] * 100 + both["b"] * 10 <= 2000
    # What b cannot use goes to a.
    assert limit_offsets(start, {"a": 1000, "b": 5}, None, 2000, sizes) == {"a": 19, "b": 5}
    # An entry larger than the bound is read alone rather than never.
    big = {"a": EntrySizes.of([], 5000.0), "b": EntrySizes.of([], 5000.0)}
    assert limit_offsets(start, latest, None, 2000, big) == {"a": 1, "b": 0}
    assert limit_offsets({"a": 1000, "b": 0}, latest, None, 2000, big) == {"a": 1000, "b": 1}
    # Neither fits its half, one fits the whole: it takes it.
    odd = {"a": EntrySizes.of([], 1500.0), "b": EntrySizes.of([], 1500.0)}
    assert limit_offsets(start, latest, None, 2000, odd) == {"a": 1, "b": 0}
    for budget in range(1, 3000, 97):
        end = limit_offsets(start, latest, None, budget, sizes)
        used = end["a"] * 100 + end["b"] * 10
        assert used <= budget or sum(end.values()) == 1


def test_offsets_serialise_in_one_key_order() -> None:
    assert json.dumps(ordered({"b": 1, "a": 2})) == json.dumps(ordered({"a": 2, "b": 1}))
    assert list(limit_offsets({"z": 0, "a": 0}, {"z": 5, "a": 5}, 3)) == ["a", "z"]


def test_stream_range_pickles_and_checks_its_bounds() -> None:
    part = StreamRange("h:1/r", "s", 3, 9, True)
    assert pickle.loads(pickle.dumps(part)) == part
    with pytest.raises(ValueError):
        StreamRange("h:1/r", "s", 9, 3, True)


def test_source_options_are_parsed_case_insensitively() -> None:
    parsed = parse_source_options(
        {
            **META,
            "STREAMS": "b, a,b",
            "startingoffsets": '{"a": 4, "b": -2}',
            "maxentriespertrigger": "10",
            "failondataloss": "FALSE",
        },
        streaming=True,
    )
    assert parsed.streams == ("b", "a")
    assert parsed.starting == {"a": 4, "b": -2}
    assert parsed.max_entries_per_trigger == 10
    assert parsed.fail_on_data_loss is False
    assert parse_source_options({**META, "streams": "a"}, streaming=True).starting == "latest"
    assert parse_source_options({**META, "streams": "a"}, streaming=False).starting == "earliest"


def test_metadata_auth_file_reaches_the_readers_the_writer_and_the_partitions() -> None:
    auth = {**META, "metadataauthfile": " /etc/streamkeeper/auth.toml "}
    source = parse_source_options({**auth, "streams": "a"}, streaming=False)
    assert source.metadata_auth_file == "/etc/streamkeeper/auth.toml"
    sink = {**auth, "stream": "b", "checkpointLocation": "/tmp/ck"}
    assert parse_sink_options(sink).metadata_auth_file == "/etc/streamkeeper/auth.toml"
    part = StreamRange("h:1/r", "s", 3, 9, True, metadata_auth_file=source.metadata_auth_file)
    assert pickle.loads(pickle.dumps(part)).metadata_auth_file == "/etc/streamkeeper/auth.toml"


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"streams": "a", "startingOffsets": '{"b": 1}'}, "startingOffsets"),
        ({"streams": "a", "startingOffsets": '{"a": -3}'}, "startingOffsets"),
        ({"streams": "a", "startingOffsets": "[1]"}, "startingOffsets"),
        ({"streams": "a", "endingOffsets": '{"a": 1}'}, "endingOffsets"),
        ({"streams": "a", "maxEntriesPerTrigger": "-1"}, "maxEntriesPerTrigger"),
        ({"streams": "a", "maxEntriesPerTrigger": "ten"}, "maxEntriesPerTrigger"),
        ({"streams": "a", "minPartitions": "0"}, "minPartitions"),
        ({"streams": "a", "minPartitions": "2.5"}, "minPartitions"),
        ({"streams": "a", "maxBytesPerTrigger": "0"}, "maxBytesPerTrigger"),
        ({"streams": "a", "maxBytesPerTrigger": "12q"}, "maxBytesPerTrigger"),
        ({"streams": "a", "maxBytesPerTrigger": "-5m"}, "maxBytesPerTrigger"),
        ({"streams": "a", "startingTimestamp": "yesterday"}, "startingTimestamp"),
        ({"streams": "a", "startingTimestamp": "-1"}, "startingTimestamp"),
        (
            {"streams": "a", "startingTimestamp": "1", "startingOffsets": "earliest"},
            "startingTimestamp",
        ),
        (
            {"streams": "a", "startingTimestamp": "1", "startingOffsetsByTimestamp": '{"a": 1}'},
            "startingTimestamp",
        ),
        ({"streams": "a", "startingOffsetsByTimestamp": "[1]"}, "startingOffsetsByTimestamp"),
        (
            {
                "streams": "a",
                "startingOffsetsByTimestamp": '{"a": 1}',
                "startingOffsets": '{"a": 1}',
            },
            "startingOffsetsByTimestamp",
        ),
        ({"streams": "a", "startingOffsetsByTimestamp": "{}"}, "startingOffsetsByTimestamp"),
        ({"streams": "a", "startingOffsetsByTimestamp": '{"a": -1}'}, "startingOffsetsByTimestamp"),
        (
            {"streams": "a", "startingOffsetsByTimestamp": '{"a": 1.5}'},
            "startingOffsetsByTimestamp",
        ),
        ({"streams": "a", "startingOffsetsByTimestamp": '{"b": 1}'}, "startingOffsetsByTimestamp"),
        ({"streams": "a", "startingOffsetsByTimestamp": '{"a/": 1}'}, "startingOffsetsByTimestamp"),
        (
            {"streams": "a", "startingOffsetsByTimestampStrategy": "earliest"},
            "startingOffsetsByTimestampStrategy",
        ),
        ({}, "streams"),
    ],
)
def test_malformed_streaming_options_name_the_option(options: dict[str, str], named: str) -> None:
    with pytest.raises(ConnectorOptionError, match=named) as failed:
        parse_source_options({**META, **options}, streaming=True)
    assert failed.value.context["option"] == named


def test_start_times() -> None:
    parsed = parse_source_options(
        {**META, "streams": "a,b", "startingtimestamp": " 1700000000000 "}, streaming=True
    )
    assert parsed.starting_times == 1_700_000_000_000
    assert parsed.start_time("b") == 1_700_000_000_000
    assert parsed.start_time_option == "startingTimestamp"
    assert parsed.starting_time_strategy == "error"
    parsed = parse_source_options(
        {
            **META,
            "streams": "a,b",
            "startingOffsetsByTimestamp": '{"a": 5}',
            "startingOffsets": '{"b": 3}',
            "startingOffsetsByTimestampStrategy": "Latest",
        },
        streaming=False,
    )
    assert (parsed.start_time("a"), parsed.start_time("b")) == (5, None)
    assert parsed.starting == {"b": 3}
    assert parsed.start_time_option == "startingOffsetsByTimestamp"
    assert parsed.starting_time_strategy == "latest"
    assert parse_source_options({**META, "streams": "a"}, streaming=True).starting_times is None


def test_byte_limits_take_spark_byte_strings() -> None:
    for raw, expected in (
        ("1048576", 1 << 20),
        ("512k", 512 << 10),
        ("64M", 64 << 20),
        ("1g", 1 << 30),
        ("2 mb", 2 << 20),
        ("100b", 100),
    ):
        parsed = parse_source_options(
            {**META, "streams": "a", "maxBytesPerTrigger": raw}, streaming=True
        )
        assert parsed.max_bytes_per_trigger == expected
    with pytest.raises(ConnectorOptionError, match="'maxBytesPerTrigger' applies to streaming"):
        parse_source_options({**META, "streams": "a", "maxBytesPerTrigger": "1m"}, streaming=False)


def test_sink_options() -> None:
    at_least_once = {**META, "stream": "out", "deliveryGuarantee": "at-least-once"}
    assert parse_sink_options(at_least_once).stream == "out"
    assert parse_sink_options(at_least_once).metadata_auth_file is None
    with pytest.raises(ConnectorOptionError, match="'stream' is required"):
        parse_sink_options(META)
    with pytest.raises(ConnectorOptionError, match="unknown option 'streams'"):
        parse_sink_options({**META, "stream": "out", "streams": "x"})


def test_the_data_source_module_loads_without_the_client_stack() -> None:
    # Spark imports it in a fresh Python process for each query's analysis and planning: the
    # client stack (0.3 s) must stay out of those, and come in only where a reader is made.
    code = (
        "import sys\n"
        "from spark_connector import StreamkeeperDataSource as S\n"
        "S({'metadata': '127.0.0.1:1/sk', 'streams': 'a'}).schema()\n"
        "heavy = [m for m in ('stream.client', 'kazoo', 'grpc') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "S({'metadata': '127.0.0.1:1/sk', 'streams': 'a'}).streamReader(None)\n"
        "assert 'stream.client' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(
    "bad",
    [
        {"minPartitions": "0"},
        {"maxBytesPerTrigger": "lots"},
        {"startingTimestamp": "-3"},
        {"startingOffsetsByTimestamp": '{"a": "noon"}'},
        {"startingOffsetsByTimestampStrategy": "first"},
    ],
)
def test_bad_new_options_fail_before_anything_connects(bad: dict[str, str]) -> None:
    # Nothing listens at port 1: an attempt to connect would fail otherwise, or hang.
    source = StreamkeeperDataSource({"metadata": "127.0.0.1:1/sk", "streams": "a", **bad})
    (option,) = bad
    for make in (source.streamReader, source.reader):
        with pytest.raises(ConnectorOptionError, match=option) as failed:
            make(StructType())
        assert failed.value.context["option"] == option


class CountingCatalog:
    """A catalog that counts its reads of the cluster: one stream "a", entries 0..9."""

    def __init__(self) -> None:
        self.reads = 0

    def all_bounds(self, *, missing_ok: bool) -> dict[str, StreamBounds]:
        self.reads += 1
        return {"a": StreamBounds("a", 0, 10, (0,))}

    def resolve_start(self, bounds: dict[str, StreamBounds], default: str) -> Offsets:
        return {"a": 3}


def counting_reader(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, CountingCatalog]:
    reader = StreamkeeperDataSource({**META, "streams": "a"}).streamReader(StructType())
    catalog = CountingCatalog()
    monkeypatch.setattr(reader, "_catalog", lambda: catalog)
    return reader, catalog


def test_initial_offsets_are_read_once_and_stay_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    # Spark asks twice as a query starts; the second answer must not cost a cluster read.
    reader, catalog = counting_reader(monkeypatch)
    first = reader.initialOffset()
    first["a"] = 99  # the caller's copy
    assert reader.initialOffset() == {"a": 3}
    assert catalog.reads == 1


def test_available_now_at_its_target_plans_without_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Spark asks for the latest offsets once more after the last batch of an availableNow
    # query: at the target, the answer is the start, with no cluster read.
    reader, catalog = counting_reader(monkeypatch)
    reader.prepareForTriggerAvailableNow()
    limit = reader.getDefaultReadLimit()
    assert reader.latestOffset({"a": 3}, limit) == {"a": 10}
    reads = catalog.reads
    assert reader.latestOffset({"a": 10}, limit) == {"a": 10}
    assert catalog.reads == reads


def test_an_available_now_query_starts_with_one_cluster_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Spark prepares the target, then asks for the initial offsets and the first batch's end
    # right after: the bounds read for the target answer all three.
    reader, catalog = counting_reader(monkeypatch)
    reader.prepareForTriggerAvailableNow()
    limit = reader.getDefaultReadLimit()
    start = reader.initialOffset()
    assert start == {"a": 3}
    assert reader.latestOffset(start, limit) == {"a": 10}
    assert catalog.reads == 1
    # Later batches (here, a replay from an earlier start) read the streams again.
    assert reader.latestOffset({"a": 0}, limit) == {"a": 10}
    assert catalog.reads == 2


def test_a_listed_stream_missing_from_the_target_is_looked_up_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The target's read leaves out a listed stream that does not exist; the initial offsets
    # read again, with the check that fails such a query.
    reader = StreamkeeperDataSource({**META, "streams": "a,b"}).streamReader(StructType())
    catalog = CountingCatalog()
    monkeypatch.setattr(reader, "_catalog", lambda: catalog)
    reader.prepareForTriggerAvailableNow()
    reader.initialOffset()
    assert catalog.reads == 2
