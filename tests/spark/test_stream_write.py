"""The streaming writer: rows' `payload` (binary or string) appended to a stream, read back
through the client and through the connector's own reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from stream.client import StreamClient
from tests.spark.conftest import append, payload

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_write_stream_appends_payloads_and_round_trips(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str, tmp_path: Path
) -> None:
    source, target = stream_name, stream_name + "-copy"
    append(client, source, 500)
    client.create_stream(target)
    term_before = client.stream_info(target).term
    query = (
        spark.readStream.format("streamkeeper")
        .option("metadata", spark_cluster.metadata)
        .option("streams", source)
        .option("startingOffsets", "earliest")
        .option("maxEntriesPerTrigger", "200")
        .option("entriesPerPartition", "64")
        .load()
        .select("payload")
        .writeStream.format("streamkeeper")
        .option("metadata", spark_cluster.metadata)
        .option("stream", target)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    reader = client.open_reader(target)
    copied = [e.payload for e in reader.read(0, reader.last_add_confirmed())]
    # Partitions of one batch keep their order; batches follow each other.
    assert copied == [payload(source, i) for i in range(500)]
    # One writer per non-empty batch (README): a new term each; the takeovers after the first
    # (of an empty stream) each end the previous term with a truncate no-op that takes one
    # entry id and that readers skip.
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert len(batches) == 3
    info = client.stream_info(target)
    assert info.term == term_before + len(batches)
    assert info.lac == 500 + (len(batches) - 1) - 1


def test_write_stream_takes_string_payloads(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str, tmp_path: Path
) -> None:
    client.create_stream(stream_name)
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", "50")
        .load()
        .selectExpr("CAST(value AS STRING) AS payload")
        .writeStream.format("streamkeeper")
        .option("metadata", spark_cluster.metadata)
        .option("stream", stream_name)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.awaitTermination(4)
    finally:
        query.stop()
    reader = client.open_reader(stream_name)
    values = [int(e.payload) for e in reader.read(0, reader.last_add_confirmed())]
    assert len(values) > 10
    assert sorted(values) == list(range(len(values)))


def test_write_stream_needs_a_payload_column_and_a_stream(
    spark: Any, spark_cluster: Any, tmp_path: Path
) -> None:
    frame = spark.readStream.format("rate").load()
    with pytest.raises(Exception, match="needs a column 'payload'"):
        frame.writeStream.format("streamkeeper").option("metadata", spark_cluster.metadata).option(
            "stream", "x"
        ).option("checkpointLocation", str(tmp_path / "a")).start().awaitTermination(60)
    with pytest.raises(Exception, match="option 'stream' is required"):
        frame.selectExpr("CAST(CAST(value AS STRING) AS BINARY) AS payload").writeStream.format(
            "streamkeeper"
        ).option("metadata", spark_cluster.metadata).option(
            "checkpointLocation", str(tmp_path / "b")
        ).start().awaitTermination(60)
