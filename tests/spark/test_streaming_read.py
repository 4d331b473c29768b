"""Streaming reads through `spark.readStream.format("streamkeeper")` into a parquet file sink
with a checkpoint, on a real cluster and local Spark."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from spark_connector.schema import SCHEMA
from stream.client import StreamClient
from tests.spark.conftest import append, payload
from tests.spark.drivers import (
    committed_offsets,
    in_flight,
    kill_9,
    release,
    start_driver,
    wait_for,
)
from tests.spark.session import start_query

pytestmark = [pytest.mark.spark, pytest.mark.integration]

TAIL_ENTRIES = int(os.environ.get("STREAMKEEPER_SPARK_TAIL_ENTRIES", "20000"))


def run_available_now(spark: Any, metadata: str, out: Path, **options: str) -> Any:
    """Runs an availableNow query to its end and returns it (stopped)."""
    query = start_query(spark, metadata, out, {"availableNow": True}, **options)
    query.awaitTermination(120)
    assert not query.isActive
    if query.exception() is not None:
        raise AssertionError(str(query.exception()))
    return query


def output(spark: Any, out: Path) -> list[tuple[str, int, bytes]]:
    """Returns the sink's committed rows (the file sink's log decides which files count)."""
    if not (out / "data" / "_spark_metadata").exists():
        return []
    rows = spark.read.schema(SCHEMA).parquet(str(out / "data")).collect()
    return [(r.stream, r.entry_id, bytes(r.payload)) for r in rows]


def test_tailing_query_killed_and_restarted_writes_every_entry_once(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str, tmp_path: Path
) -> None:
    client.create_stream(stream_name)
    total = TAIL_ENTRIES
    produced = threading.Event()

    def produce() -> None:
        with client.open_writer(stream_name) as writer:
            for i in range(total):
                writer.append_async(payload(stream_name, i))
                if i % 1000 == 999:
                    writer.flush()
                    time.sleep(0.05)
            writer.flush()
        produced.set()

    options = {
        "streams": stream_name,
        "startingOffsets": "earliest",
        "maxEntriesPerTrigger": str(max(1000, total // 10)),
    }
    trigger = {"processingTime": "100 milliseconds"}
    producer = threading.Thread(target=produce, name="producer")
    producer.start()
    try:
        query = start_query(spark, spark_cluster.metadata, tmp_path, trigger, **options)
        deadline = time.monotonic() + 120
        while len(output(spark, tmp_path)) < total // 3 and time.monotonic() < deadline:
            time.sleep(0.5)
        query.stop()  # in the middle: the producer is still appending
        assert len(output(spark, tmp_path)) < total
        query = start_query(spark, spark_cluster.metadata, tmp_path, trigger, **options)
        while time.monotonic() < deadline:
            if produced.is_set() and len(output(spark, tmp_path)) >= total:
                break
            assert query.exception() is None, str(query.exception())
            time.sleep(0.5)
        query.stop()
    finally:
        producer.join()
    rows = sorted(output(spark, tmp_path), key=lambda r: r[1])
    assert [r[2] for r in rows] == [payload(stream_name, i) for i in range(total)]
    assert len({r[1] for r in rows}) == total


KILLED_QUERY_ENTRIES = int(os.environ.get("STREAMKEEPER_SPARK_KILL_ENTRIES", "100000"))
TAIL_DRIVER = "tests.spark.tail_query_driver"


def test_query_process_killed_with_sigkill_mid_stream_and_restarted_writes_every_entry_once(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str, tmp_path: Path
) -> None:
    """The must-show of docs/design.md §8: a checkpointed query in its own process tails a stream
    while a producer appends 100,000 entries; kill -9 of that process mid-stream and a restart on
    the same checkpoint leave the parquet output with every payload once, in entry order."""
    client.create_stream(stream_name)
    total = KILLED_QUERY_ENTRIES
    appended = 0
    killed = threading.Event()
    first_flushed = threading.Event()  # a held driver's warm-up reads the first entry

    def produce() -> None:
        nonlocal appended
        with client.open_writer(stream_name) as writer:
            for start in range(0, total, 1000):
                if start == total * 4 // 5:
                    # However slow the query is, the kill lands before the producer is done.
                    killed.wait(timeout=120)
                for i in range(start, min(start + 1000, total)):
                    writer.append_async(payload(stream_name, i))
                writer.flush()
                appended = min(start + 1000, total)
                first_flushed.set()
                time.sleep(0.25)

    producer = threading.Thread(target=produce, name="producer")
    producer.start()
    drivers: list[subprocess.Popen[bytes]] = []
    deadline = time.monotonic() + 240
    try:
        began = time.monotonic()
        args = ("--metadata", spark_cluster.metadata, "--streams", stream_name)
        assert first_flushed.wait(60)
        drivers.append(start_driver(TAIL_DRIVER, tmp_path, 1, *args))
        # The restart's JVM starts now and waits: after the kill it only starts its query.
        drivers.append(start_driver(TAIL_DRIVER, tmp_path, 2, *args, held=True))
        # Mid-stream and mid-batch: a batch committed, the next one planned and running.
        at_kill = wait_for(
            tmp_path,
            stream_name,
            drivers[0],
            1,
            lambda offset: offset > 0 and in_flight(tmp_path),
            deadline,
        )
        kill_9(drivers[0])
        appended_at_kill = appended
        killed.set()
        committed = committed_offsets(tmp_path).get(stream_name, 0)
        assert at_kill <= committed < total and appended_at_kill < total
        killed_at = time.monotonic()
        release(drivers[1])
        wait_for(tmp_path, stream_name, drivers[1], 2, lambda offset: offset >= total, deadline)
        # Figures for the log (pytest -s), no assertion on time.
        print(
            f"killed at entry {at_kill} ({appended_at_kill} appended) after "
            f"{killed_at - began:.1f} s; restarted run done in "
            f"{time.monotonic() - killed_at:.1f} s"
        )
    finally:
        killed.set()
        for driver in drivers:
            kill_9(driver)
        producer.join()
    # A batch running at the kill may have left parquet files that no batch committed; the file
    # sink lists a batch's files in its _spark_metadata log only at commit, and spark.read
    # reads what that log lists, so the leftovers never count (globbing *.parquet would).
    rows = sorted(output(spark, tmp_path), key=lambda r: r[1])
    assert len(rows) == total
    assert [r[1] for r in rows] == list(range(total))
    assert [r[2] for r in rows] == [payload(stream_name, i) for i in range(total)]
    assert {r[0] for r in rows} == {stream_name}


def test_available_now_with_max_entries_per_trigger_reads_in_bounded_batches(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str, tmp_path: Path
) -> None:
    append(client, stream_name, 1000)
    query = run_available_now(
        spark,
        spark_cluster.metadata,
        tmp_path,
        streams=stream_name,
        startingOffsets="earliest",
        maxEntriesPerTrigger="300",
    )
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [300, 300, 300, 100]
    rows = output(spark, tmp_path)
    assert sorted(r[1] for r in rows) == list(range(1000))
    # Nothing new: a rerun from the checkpoint adds nothing.
    append(client, stream_name, 0)
    run_available_now(
        spark,
        spark_cluster.metadata,
        tmp_path,
        streams=stream_name,
        startingOffsets="earliest",
        maxEntriesPerTrigger="300",
    )
    assert len(output(spark, tmp_path)) == 1000


def test_starting_offsets_json_over_two_streams(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str, tmp_path: Path
) -> None:
    other = stream_name + "-b"
    append(client, stream_name, 100)
    append(client, other, 100)
    run_available_now(
        spark,
        spark_cluster.metadata,
        tmp_path,
        streams=f"{stream_name},{other}",
        startingOffsets=json.dumps({stream_name: 90, other: -2}),
        maxEntriesPerTrigger="70",
    )
    rows = output(spark, tmp_path)
    assert sorted((r[0], r[1]) for r in rows) == sorted(
        [(stream_name, i) for i in range(90, 100)] + [(other, i) for i in range(100)]
    )


def test_latest_start_reads_only_entries_appended_after_the_query_began(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str, tmp_path: Path
) -> None:
    append(client, stream_name, 50)
    run_available_now(spark, spark_cluster.metadata, tmp_path, streams=stream_name)
    assert output(spark, tmp_path) == []
    append(client, stream_name, 20, start=50)
    run_available_now(spark, spark_cluster.metadata, tmp_path, streams=stream_name)
    assert sorted(r[2] for r in output(spark, tmp_path)) == [
        payload(stream_name, i) for i in range(50, 70)
    ]


def test_a_batch_replayed_after_a_crash_reads_the_same_rows(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str, tmp_path: Path
) -> None:
    append(client, stream_name, 1000)
    options = {"streams": stream_name, "startingOffsets": "earliest", "maxEntriesPerTrigger": "300"}
    run_available_now(spark, spark_cluster.metadata, tmp_path, **options)
    # A crash after batch 3 was planned (its offsets logged) and before it was committed:
    # neither the checkpoint nor the file sink knows it happened.
    for done in (tmp_path / "checkpoint" / "commits", tmp_path / "data" / "_spark_metadata"):
        for name in ("3", ".3.crc"):
            (done / name).unlink()
    assert len(output(spark, tmp_path)) == 900
    append(client, stream_name, 500, start=1000)  # the LAC moves on meanwhile

    query = run_available_now(spark, spark_cluster.metadata, tmp_path, **options)
    batches = [(p["batchId"], p["numInputRows"]) for p in query.recentProgress]
    assert batches[0] == (3, 100)  # the replay ends where the logged batch ended
    rows = sorted(output(spark, tmp_path), key=lambda r: r[1])
    assert [r[2] for r in rows] == [payload(stream_name, i) for i in range(1500)]
