"""`maxBytesPerTrigger` and `maxEntriesPerTrigger` on a real cluster and local Spark: every
micro-batch within the bounds, every entry read once, availableNow runs that stop."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from stream.client import StreamClient
from tests.spark.conftest import append
from tests.spark.session import start_batch_query

pytestmark = [pytest.mark.spark, pytest.mark.integration]

# One micro-batch's rows: (stream, entry id, payload bytes).
Batch = list[tuple[str, int, int]]


def run_batches(spark: Any, metadata: str, out: Path, **options: str) -> list[Batch]:
    """Runs an availableNow query with `options` to its end (it must stop by itself) and
    returns its non-empty micro-batches' rows, in batch order."""
    batches: dict[int, Batch] = {}

    def record(frame: Any, batch_id: int) -> None:
        rows = frame.selectExpr("stream", "entry_id", "length(payload) AS size").collect()
        batches[batch_id] = [(r.stream, r.entry_id, r.size) for r in rows]

    query = start_batch_query(spark, metadata, out, {"availableNow": True}, record, **options)
    query.awaitTermination(180)
    assert not query.isActive, "the availableNow query did not stop"
    assert query.exception() is None, str(query.exception())
    return [rows for _, rows in sorted(batches.items()) if rows]


def test_max_bytes_per_trigger_bounds_every_micro_batch(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str, tmp_path: Path
) -> None:
    small, large = stream_name, stream_name + "-large"
    # 1,000-byte entries in three rolled fragments (metadata records their bytes) and an open
    # one; 2,000-byte entries in one open fragment (their size is sampled).
    append(client, small, 1000, size=1000, fragment_max_entries=300)
    append(client, large, 500, size=2000)
    limit = 100 * 1024
    batches = run_batches(
        spark,
        spark_cluster.metadata,
        tmp_path,
        streams=f"{small},{large}",
        startingOffsets="earliest",
        maxBytesPerTrigger="100k",
    )
    sizes = [sum(size for _, _, size in rows) for rows in batches]
    assert max(sizes) <= limit, sizes
    assert len(batches) >= (1000 * 1000 + 500 * 2000) // limit
    read = sorted((s, i) for rows in batches for s, i, _ in rows)
    assert read == sorted([(small, i) for i in range(1000)] + [(large, i) for i in range(500)])


def test_available_now_with_both_limits_reads_everything_in_bounded_batches_and_stops(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str, tmp_path: Path
) -> None:
    append(client, stream_name, 3000, size=500, fragment_max_entries=1000)
    options = {
        "streams": stream_name,
        "startingOffsets": "earliest",
        "maxEntriesPerTrigger": "400",
        "maxBytesPerTrigger": "150000",  # 300 entries of 500 bytes
    }
    # A producer appends meanwhile: a run reads up to where the stream was when it began.
    producer = threading.Thread(
        target=append,
        args=(client, stream_name, 2000, 3000, 500),
        kwargs={"fragment_max_entries": 1000},
        name="producer",
    )
    producer.start()
    try:
        first_run = run_batches(spark, spark_cluster.metadata, tmp_path, **options)
    finally:
        producer.join()
    second_run = run_batches(spark, spark_cluster.metadata, tmp_path, **options)
    for rows in first_run + second_run:
        assert len(rows) <= 300 and sum(size for _, _, size in rows) <= 150_000
    # Each run reads on from where the last stopped; every entry once (the producer's
    # takeover adds a no-op entry, which no run shows).
    first_ids = [i for rows in first_run for _, i, _ in rows]
    second_ids = [i for rows in second_run for _, i, _ in rows]
    assert len(first_ids) >= 3000 and max(first_ids) < min(second_ids, default=max(first_ids) + 1)
    assert len(set(first_ids + second_ids)) == len(first_ids + second_ids) == 5000
    # Bounded by the byte limit (300 entries), not the entry limit (400).
    assert max(len(rows) for rows in first_run + second_run) == 300
