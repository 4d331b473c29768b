"""The stream reader of PySpark 4.0 and 4.1 (no read limits; `latestOffset()` without
arguments), called the way those versions call it, on a real cluster: only 4.2+ is installed."""

from __future__ import annotations

import importlib.util
import inspect
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from spark_connector.options import parse_source_options
from spark_connector.ranges import StreamRange
from spark_connector.stream_reader import LegacyStreamReader, new_stream_reader
from stream.client import StreamClient
from tests.spark.conftest import append

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def legacy_reader(metadata: str, stream: str, **options: str) -> LegacyStreamReader:
    parsed = parse_source_options(
        {"metadata": metadata, "streams": stream, "startingOffsets": "earliest", **options},
        streaming=True,
    )
    return LegacyStreamReader(parsed)


def run_batches(reader: LegacyStreamReader, stream: str) -> list[tuple[int, int]]:
    """Plans batches as PySpark 4.0 does (latestOffset(), partitions, commit) until one
    brings nothing new; returns each batch's entries as (first, last) per stream."""
    start = reader.initialOffset()
    batches = []
    while (end := reader.latestOffset()) != start:
        parts = reader.partitions(start, end)
        assert all(isinstance(p, StreamRange) and p.stream == stream for p in parts)
        batches.append((min(p.first for p in parts), max(p.last for p in parts)))
        reader.commit(end)
        start = end
    return batches


def test_legacy_reader_applies_max_entries_and_max_bytes_per_trigger(
    spark_cluster: Any, client: StreamClient, stream_name: str
) -> None:
    append(client, stream_name, 1000, size=100, fragment_max_entries=400)
    # PySpark 4.3 too would call it without arguments (it inspects the signature).
    assert not inspect.signature(LegacyStreamReader.latestOffset).parameters.keys() - {"self"}
    by_entries = legacy_reader(spark_cluster.metadata, stream_name, maxEntriesPerTrigger="300")
    assert run_batches(by_entries, stream_name) == [(0, 299), (300, 599), (600, 899), (900, 999)]
    by_bytes = legacy_reader(spark_cluster.metadata, stream_name, maxBytesPerTrigger="25000")
    assert run_batches(by_bytes, stream_name) == [(0, 249), (250, 499), (500, 749), (750, 999)]
    both = legacy_reader(
        spark_cluster.metadata, stream_name, maxEntriesPerTrigger="300", maxBytesPerTrigger="2k"
    )
    assert run_batches(both, stream_name)[:2] == [(0, 19), (20, 39)]


def test_legacy_reader_after_a_restart_goes_on_from_the_replayed_batch(
    spark_cluster: Any, client: StreamClient, stream_name: str
) -> None:
    append(client, stream_name, 1000)
    reader = legacy_reader(spark_cluster.metadata, stream_name, maxEntriesPerTrigger="300")
    # A restart replays the batch the offset log holds uncommitted, then asks for the next.
    reader.partitions({stream_name: 300}, {stream_name: 600})
    assert reader.latestOffset() == {stream_name: 900}
    # After a restart whose last batch was committed, the start is not known: all of it.
    assert legacy_reader(
        spark_cluster.metadata, stream_name, maxEntriesPerTrigger="300"
    ).latestOffset() == {stream_name: 1000}


def test_without_read_limits_the_legacy_reader_is_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    options = parse_source_options({"metadata": "h:1/r", "streams": "a"}, streaming=True)
    assert type(new_stream_reader(options)).__name__ == "StreamReader"
    # PySpark 4.0 and 4.1 have no pyspark.sql.streaming.datasource (the read limits).
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *rest: (
            None if name == "pyspark.sql.streaming.datasource" else find_spec(name, *rest)
        ),
    )
    assert type(new_stream_reader(options)) is LegacyStreamReader
