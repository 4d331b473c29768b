"""Streaming reads through `spark.readStream.format("streamkeeper")` into a parquet file sink
with a checkpoint, on a real cluster and local Spark."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from spark_connector.schema import SCHEMA
from stream.client import StreamClient
from tests.spark.conftest import append, payload
from tests.spark.session import ROOT, start_query

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


def batch_ids(out: Path, log: str) -> list[int]:
    """Returns the batch ids in the checkpoint's `log` (offsets: planned, commits: done)."""
    folder = out / "checkpoint" / log
    if not folder.exists():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def committed_offsets(out: Path) -> dict[str, int]:
    """Returns the end offsets of the query's last committed batch ({} before the first): the
    checkpoint's commits/N says batch N is done, offsets/N ("v1", metadata, then our source's
    offset JSON) where it ended."""
    done = batch_ids(out, "commits")
    if not done:
        return {}
    lines = (out / "checkpoint" / "offsets" / str(done[-1])).read_text().splitlines()
    return json.loads(lines[-1])


def in_flight(out: Path) -> bool:
    """Returns whether a batch was committed and the next one planned but not committed."""
    done, planned = batch_ids(out, "commits"), batch_ids(out, "offsets")
    return bool(done) and bool(planned) and planned[-1] > done[-1]


def process_tree(pid: int) -> list[int]:
    """Returns `pid` and all its descendants alive now (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_9(process: subprocess.Popen[bytes]) -> None:
    """SIGKILLs the driver's whole process tree at once, like a crash of its machine: its
    process group (the driver Python and the JVM), and the groups of its descendants (PySpark's
    worker daemon puts itself and its workers in a group of their own)."""
    if process.poll() is not None:
        return  # gone already (and its pid may be reused)
    tree = process_tree(process.pid)
    groups = {process.pid}
    for pid in tree:
        try:
            if os.getpgid(pid) in tree:
                groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in tree), [p for p in tree if alive(p)]


def start_driver(metadata: str, stream: str, out: Path, run: int) -> subprocess.Popen[bytes]:
    """Starts tail_query_driver in a new session (its own process group), logging to
    out/driver-RUN.log."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    )
    with open(out / f"driver-{run}.log", "wb") as log_file:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.spark.tail_query_driver",
                "--metadata",
                metadata,
                "--streams",
                stream,
                "--out",
                str(out),
                "--max-entries-per-trigger",
                "10000",
            ],
            cwd=ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_for(
    out: Path,
    stream: str,
    driver: subprocess.Popen[bytes],
    run: int,
    reached: Callable[[int], bool],
    deadline: float,
) -> int:
    """Returns the stream's committed offset once `reached(offset)` holds; fails when the
    driver exits or the deadline passes (with the driver's log tail)."""
    while True:
        offset = committed_offsets(out).get(stream, 0)
        if reached(offset):
            return offset
        if driver.poll() is not None or time.monotonic() > deadline:
            log_tail = (out / f"driver-{run}.log").read_text(errors="replace")[-3000:]
            raise AssertionError(
                f"driver run {run} (exit {driver.poll()}) at offset {offset}:\n{log_tail}"
            )
        time.sleep(0.2)


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
                time.sleep(0.25)

    producer = threading.Thread(target=produce, name="producer")
    producer.start()
    drivers: list[subprocess.Popen[bytes]] = []
    deadline = time.monotonic() + 240
    try:
        began = time.monotonic()
        drivers.append(start_driver(spark_cluster.metadata, stream_name, tmp_path, 1))
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
        drivers.append(start_driver(spark_cluster.metadata, stream_name, tmp_path, 2))
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
