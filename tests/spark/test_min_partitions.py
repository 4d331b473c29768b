"""`minPartitions` on a real cluster and local Spark: at least that many partitions per batch
read and per micro-batch, every entry once, partitions still within `entriesPerPartition`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from stream.client import StreamClient
from tests.spark.conftest import append
from tests.spark.session import start_batch_query

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def partition_sizes(frame: Any) -> list[int]:
    """Returns the number of rows in each of the frame's Spark partitions."""
    return frame.rdd.glom().map(len).collect()


def test_batch_read_has_at_least_min_partitions(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str
) -> None:
    other = stream_name + "-b"
    append(client, stream_name, 1000, fragment_max_entries=600)
    append(client, other, 30)
    frame = (
        spark.read.format("streamkeeper")
        .option("metadata", spark_cluster.metadata)
        .option("streams", f"{stream_name},{other}")
        .option("entriesPerPartition", "400")
        .option("minPartitions", "9")
        .load()
    )
    sizes = partition_sizes(frame)
    # Without minPartitions: 0..399, 400..599 (fragment end), 600..999 and the other stream.
    assert len(sizes) >= 9
    assert max(sizes) <= 400 and sum(sizes) == 1030
    rows = frame.collect()
    assert sorted((r.stream, r.entry_id) for r in rows) == sorted(
        [(stream_name, i) for i in range(1000)] + [(other, i) for i in range(30)]
    )


def test_every_micro_batch_has_at_least_min_partitions(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str, tmp_path: Path
) -> None:
    append(client, stream_name, 1000)
    seen: list[tuple[int, int, list[int]]] = []

    def record(batch: Any, batch_id: int) -> None:
        sizes = partition_sizes(batch)
        ids = [r.entry_id for r in batch.select("entry_id").collect()]
        seen.append((batch_id, len(sizes), ids))

    query = start_batch_query(
        spark,
        spark_cluster.metadata,
        tmp_path,
        {"availableNow": True},
        record,
        streams=stream_name,
        startingOffsets="earliest",
        maxEntriesPerTrigger="400",
        minPartitions="6",
    )
    query.awaitTermination(120)
    assert not query.isActive and query.exception() is None, str(query.exception())
    batches = [(n, ids) for _, n, ids in seen if ids]
    assert [len(ids) for _, ids in batches] == [400, 400, 200]
    assert all(n >= 6 for n, _ in batches), [n for n, _ in batches]
    assert sorted(i for _, ids in batches for i in ids) == list(range(1000))
