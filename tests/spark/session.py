"""The local[2] SparkSession of the Spark tests, shared by the session fixture (conftest) and
the driver scripts that run a query in a process of their own (tail_query_driver,
sink_query_driver), and what a held driver does before its release (`hold`)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


# For short-lived driver processes: C1 only and the serial GC start a JVM in about 2/3 of the
# time on a 2-core machine (no C2 compile threads and parallel GC threads competing).
FAST_START_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def local_session(app_name: str, local_dir: Path, *, fast_start: bool = False) -> Any:
    """Returns a local[2] SparkSession (UI off, loopback only, UTC) with the connector
    registered; its Python workers run this interpreter and import this worktree.
    `fast_start` trades the JVM's peak speed for a quicker start."""
    from pyspark.sql import SparkSession

    import spark_connector

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    builder = SparkSession.builder
    if fast_start:
        builder = builder.config("spark.driver.extraJavaOptions", FAST_START_JAVA_OPTIONS)
    session = (
        builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.local.dir", str(local_dir))
        .getOrCreate()
    )
    spark_connector.register(session)
    return session


def hold(spark: Any, metadata: str, stream: str) -> None:
    """For a driver started held (tests.spark.drivers): reads `stream`'s first entry (it must
    have one) through the connector, the work a fresh JVM is slowest at in its first batch
    (Python workers, the connector's planning), then blocks until the test writes a line on
    stdin (its release)."""
    first = json.dumps({stream: 1})
    frame = _loaded(spark.read, metadata, {"streams": stream, "endingOffsets": first})
    frame.collect()
    sys.stdin.readline()


def _loaded(reader: Any, metadata: str, options: dict[str, str]) -> Any:
    """Returns the frame of a `streamkeeper` read (`spark.read` or `spark.readStream`)."""
    frame = reader.format("streamkeeper").option("metadata", metadata)
    for key, value in options.items():
        frame = frame.option(key, value)
    return frame.load()


def start_query(
    spark: Any, metadata: str, out: Path, trigger: dict[str, Any], **options: str
) -> Any:
    """Starts a `streamkeeper` read with `options` into a parquet file sink at `out/data`
    (checkpoint `out/checkpoint`) and returns the StreamingQuery."""
    return (
        _loaded(spark.readStream, metadata, options)
        .writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(**trigger)
        .start()
    )


def start_batch_query(
    spark: Any,
    metadata: str,
    out: Path,
    trigger: dict[str, Any],
    on_batch: Callable[[Any, int], None],
    **options: str,
) -> Any:
    """Starts a `streamkeeper` read with `options` whose micro-batches go to
    `on_batch(frame, batch_id)` (foreachBatch; checkpoint `out/checkpoint`)."""
    return (
        _loaded(spark.readStream, metadata, options)
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(**trigger)
        .start()
    )
