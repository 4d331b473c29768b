"""The Spark connector's read throughput: rows/s and MB/s of a local[2] availableNow query
from a stream of 1 KiB entries into parquet, against the same query over a synthetic
in-memory Python source (same schema, same partition sizes, Arrow batches) in the same run;
their ratio is the connector's own cost.

Starts a real ZooKeeper and three bookie processes in a temporary directory, preloads the
stream with one writer, then runs: a warm-up query, then `--rounds` times the synthetic query
and the connector query, alternating (each into a new output). Round 1's connector query is
cold (its Python workers import the connector and connect first); later rounds reuse Spark's
Python workers and their clients, as a long-running query does. A 2-core machine shared with
other work makes single runs noisy: the load average is printed, and with several rounds the
median ratio is. Each query prints its wall-clock time, the part of it before Spark's first
trigger and after its last (the query's start: the driver's fresh Python process for the source,
its imports, the source's first cluster reads) and Spark's own phase times. The project's
modules are byte-compiled first, as installing the package does (`--no-byte-compile` leaves
them as they are). Then, `--sink-rounds` times, the stream is copied by a streamkeeper ->
streamkeeper query with the exactly-once sink and with the at-least-once sink, alternating
(rows/s of each, and their ratio). Last, `--read-rounds` times, the connector's partition
reader reads the whole stream in this process, outside Spark: its CPU and the bookies' per
entry (from /proc) are the connector's own cost without Spark's share.

    PYTHONPATH=. .venv/bin/python bench/spark_bench.py --entries 100000 --rounds 3
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

import spark_connector
from spark_connector.partition_reader import read_range
from spark_connector.ranges import StreamRange
from spark_connector.schema import ARROW_SCHEMA, SCHEMA
from stream.client import StreamClient
from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.processes import cpu_seconds

PARTITION_ENTRIES = int(os.environ.get("SPARK_BENCH_PARTITION_ENTRIES", "50000"))


@dataclass(frozen=True)
class SyntheticRange(InputPartition):
    first: int
    last: int
    size: int


class SyntheticReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, entries: int, size: int) -> None:
        self.entries, self.size = entries, size

    def initialOffset(self) -> dict:
        return {"n": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return {"n": self.entries}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [
            SyntheticRange(lo, min(lo + PARTITION_ENTRIES, end["n"]) - 1, self.size)
            for lo in range(start["n"], end["n"], PARTITION_ENTRIES)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SyntheticRange)
        base = b"x" * (partition.size - 16)
        now_us = int(time.time() * 1e6)
        for lo in range(partition.first, partition.last + 1, 8192):
            ids = list(range(lo, min(lo + 8192, partition.last + 1)))
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(["synthetic"] * len(ids), pa.string()),
                    pa.array(ids, pa.int64()),
                    pa.array([b"%016d" % i + base for i in ids], pa.binary()),
                    pa.array([now_us] * len(ids), pa.int64()).cast(
                        ARROW_SCHEMA.field("timestamp").type
                    ),
                    # Columns after the first four (the entry's key): none.
                    *(pa.nulls(len(ids), f.type) for f in list(ARROW_SCHEMA)[4:]),
                ],
                schema=ARROW_SCHEMA,
            )


class SyntheticSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "synthetic"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return SyntheticReader(int(self.options["entries"]), int(self.options["size"]))


def timed_query(spark: SparkSession, fmt: str, out: Path, **options: str) -> float:
    """Runs an availableNow query from `fmt` into parquet; prints where Spark says its time
    went (durationMs summed over its micro-batches) and returns its wall-clock seconds."""
    reader = spark.readStream.format(fmt)
    for key, value in options.items():
        reader = reader.option(key, value)
    began = time.monotonic()
    began_wall = time.time()
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    seconds = time.monotonic() - began
    ended_wall = time.time()
    phases: dict[str, int] = {}
    for progress in query.recentProgress:
        for phase, ms in progress["durationMs"].items():
            phases[phase] = phases.get(phase, 0) + ms
    # The time outside the micro-batches: the query's start (the source made and its initial
    # offsets read) before the first trigger, its stop after the last.
    triggers = [
        (datetime.fromisoformat(p["timestamp"]).timestamp(), p["durationMs"]["triggerExecution"])
        for p in query.recentProgress
    ]
    before = triggers[0][0] - began_wall if triggers else 0.0
    after = ended_wall - (triggers[-1][0] + triggers[-1][1] / 1000) if triggers else 0.0
    print(
        f"{fmt:>12}: {seconds:6.2f} s ({before:.2f} s before the first trigger, {after:.2f} s "
        "after the last); Spark's phases (ms): "
        + ", ".join(f"{k} {v}" for k, v in sorted(phases.items())),
        flush=True,
    )
    return seconds


def timed_copy(
    spark: SparkSession,
    metadata: str,
    client: StreamClient,
    target: str,
    out: Path,
    guarantee: str,
) -> float:
    """Copies stream `bench` into a new stream `target` with an availableNow query through the
    streamkeeper sink (`guarantee`); returns its wall-clock seconds."""
    client.create_stream(target, fragment_max_entries=200_000, fragment_max_bytes=1 << 30)
    began = time.monotonic()
    query = (
        spark.readStream.format("streamkeeper")
        .option("metadata", metadata)
        .option("streams", "bench")
        .option("startingOffsets", "earliest")
        .option("maxEntriesPerTrigger", "20000")
        .load()
        .select("payload")
        .writeStream.format("streamkeeper")
        .option("metadata", metadata)
        .option("stream", target)
        .option("deliveryGuarantee", guarantee)
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    return time.monotonic() - began


def sink_rounds(spark: SparkSession, metadata: str, work: Path, entries: int, rounds: int) -> None:
    """Copies the stream `rounds` times with each sink, alternating; prints rows/s."""
    client = StreamClient.connect(metadata)
    figures: dict[str, list[float]] = {"exactly-once": [], "at-least-once": []}
    try:
        for r in range(rounds):
            for guarantee, seconds in figures.items():
                target = f"copy-{guarantee}-{r}"
                took = timed_copy(spark, metadata, client, target, work / target, guarantee)
                seconds.append(took)
                print(
                    f"sink {guarantee:>13} round {r + 1}: {entries} rows in {took:6.2f} s = "
                    f"{entries / took:9.0f} rows/s",
                    flush=True,
                )
    finally:
        client.close()
    if rounds:
        exactly = statistics.median(figures["exactly-once"])
        at_least = statistics.median(figures["at-least-once"])
        print(
            f"sink median rows/s: exactly-once {entries / exactly:.0f}, at-least-once "
            f"{entries / at_least:.0f}, ratio {at_least / exactly:.2f}"
        )


def read_cpu(cluster: SandboxCluster, entries: int, rounds: int) -> None:
    """Reads the stream with the partition reader `rounds` times; prints the CPU per entry of
    this process and of the bookies."""
    bookie_pids = [bookie.pid for bookie in cluster.bookies]
    part = StreamRange(cluster.metadata, "bench", 0, entries - 1, True)
    reader_us: list[float] = []
    bookie_us: list[float] = []
    for r in range(rounds):
        bookies_before = sum(map(cpu_seconds, bookie_pids))
        cpu_before = time.process_time()
        began = time.perf_counter()
        rows = sum(batch.num_rows for batch in read_range(part))
        wall = time.perf_counter() - began
        reader_us.append((time.process_time() - cpu_before) / rows * 1e6)
        bookie_us.append((sum(map(cpu_seconds, bookie_pids)) - bookies_before) / rows * 1e6)
        print(
            f"read {r + 1}: {rows} entries in {wall:.2f} s = {rows / wall:9.0f}/s outside "
            f"Spark; CPU per entry: reader {reader_us[-1]:.2f} us, bookies "
            f"{bookie_us[-1]:.2f} us",
            flush=True,
        )
    if rounds:
        print(
            f"median CPU per entry read: reader {statistics.median(reader_us):.2f} us, "
            f"bookies {statistics.median(bookie_us):.2f} us"
        )


def byte_compile_project() -> None:
    """Writes the bytecode of the project's packages next to their sources, as installing the
    package does. Spark starts a fresh Python process for each query's source on the driver;
    where PYTHONDONTWRITEBYTECODE is set (as on the shared machines), that process would
    otherwise compile the client stack from source at every query, about 0.3 s of CPU that
    no installed deployment pays (the synthetic source imports none of it)."""
    root = Path(spark_connector.__file__).resolve().parent.parent
    for package in ("stream", "spark_connector"):
        if not compileall.compile_dir(root / package, quiet=1):
            raise SystemExit(f"byte-compiling {root / package} failed")
    print(f"byte-compiled stream/ and spark_connector/ under {root}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--read-rounds", type=int, default=3)
    parser.add_argument("--sink-rounds", type=int, default=1)
    parser.add_argument(
        "--no-byte-compile",
        action="store_true",
        help="leave the project's modules uncompiled (each query's driver process compiles "
        "what it imports, where PYTHONDONTWRITEBYTECODE is set)",
    )
    args = parser.parse_args()
    if args.entries < 1 or args.size < 16 or args.rounds < 1 or args.read_rounds < 0:
        raise SystemExit("--entries and --rounds must be >= 1, --size >= 16, --read-rounds >= 0")
    if not args.no_byte_compile:
        byte_compile_project()
    load_before = os.getloadavg()[0]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="spark-bench-") as tmp:
        work = Path(tmp)
        with SandboxCluster(work / "cluster", bookies=3) as cluster:
            client = StreamClient.connect(cluster.metadata)
            client.create_stream("bench", fragment_max_entries=200_000, fragment_max_bytes=1 << 30)
            base = b"y" * (args.size - 16)
            with client.open_writer("bench") as writer:
                for i in range(args.entries):
                    writer.append_async(b"%016d" % i + base)
                writer.flush()
            client.close()
            spark = (
                SparkSession.builder.master("local[2]")
                .config("spark.ui.enabled", "false")
                .config("spark.driver.bindAddress", "127.0.0.1")
                .config("spark.sql.shuffle.partitions", "2")
                .getOrCreate()
            )
            try:
                spark_connector.register(spark)
                spark.dataSource.register(SyntheticSource)
                timed_query(
                    spark, "synthetic", work / "warmup", entries="1000", size=str(args.size)
                )
                synthetic_s: list[float] = []
                connector_s: list[float] = []
                for r in range(args.rounds):
                    synthetic_s.append(
                        timed_query(
                            spark,
                            "synthetic",
                            work / f"synthetic-{r}",
                            entries=str(args.entries),
                            size=str(args.size),
                        )
                    )
                    connector_s.append(
                        timed_query(
                            spark,
                            "streamkeeper",
                            work / f"connector-{r}",
                            metadata=cluster.metadata,
                            streams="bench",
                            startingOffsets="earliest",
                            entriesPerPartition=str(PARTITION_ENTRIES),
                        )
                    )
                    rows = spark.read.parquet(str(work / f"connector-{r}" / "data")).count()
                    if rows != args.entries:
                        raise SystemExit(f"round {r + 1}: {rows} rows, not {args.entries}")
                sink_rounds(spark, cluster.metadata, work, args.entries, args.sink_rounds)
            finally:
                spark.stop()
            read_cpu(cluster, args.entries, args.read_rounds)
    mb = args.entries * args.size / 1e6
    for r, (synthetic, connector) in enumerate(zip(synthetic_s, connector_s, strict=True)):
        print(f"round {r + 1}{' (cold connector)' if r == 0 else ''}:")
        for label, seconds in (("synthetic", synthetic), ("streamkeeper", connector)):
            print(
                f"{label:>12}: {args.entries} rows in {seconds:6.2f} s = "
                f"{args.entries / seconds:9.0f} rows/s, {mb / seconds:7.1f} MB/s"
            )
        print(f"ratio streamkeeper/synthetic rows/s: {synthetic / connector:.2f}")
    ratios = [s / c for s, c in zip(synthetic_s, connector_s, strict=True)]
    print(
        f"median ratio over {args.rounds} round(s): {statistics.median(ratios):.2f} "
        f"(load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after)"
    )


if __name__ == "__main__":
    main()
