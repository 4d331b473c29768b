"""Batch reads through `spark.read.format("streamkeeper")` on a real cluster and local Spark:
every committed entry once, positions from options, no-ops left out, option errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from stream.client import StreamClient
from tests.spark.conftest import append, payload

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def read(spark: Any, metadata: str, **options: str) -> list[tuple[str, int, bytes]]:
    frame = spark.read.format("streamkeeper").option("metadata", metadata)
    for key, value in options.items():
        frame = frame.option(key, value)
    rows = frame.load().collect()
    return [(r.stream, r.entry_id, bytes(r.payload)) for r in rows]


def test_schema_is_the_documented_one(spark: Any, spark_cluster: Any, client: StreamClient,
                                      stream_name: str) -> None:
    append(client, stream_name, 3)
    frame = spark.read.format("streamkeeper").option("metadata", spark_cluster.metadata) \
        .option("streams", stream_name).load()
    assert frame.schema.simpleString() == (
        "struct<stream:string,entry_id:bigint,payload:binary,timestamp:timestamp,key:binary>"
    )
    rows = frame.orderBy("entry_id").collect()
    assert [r.entry_id for r in rows] == [0, 1, 2]
    assert all(r.timestamp.year >= 2024 for r in rows)


def test_batch_read_returns_every_entry_once_across_fragments_and_streams(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str
) -> None:
    other = stream_name + "-b"
    append(client, stream_name, 1000, fragment_max_entries=300)
    append(client, other, 50)
    rows = read(spark, spark_cluster.metadata, streams=f"{stream_name},{other}",
                entriesPerPartition="128")
    assert sorted(rows) == sorted(
        [(stream_name, i, payload(stream_name, i)) for i in range(1000)]
        + [(other, i, payload(other, i)) for i in range(50)]
    )


def test_starting_and_ending_offsets_bound_the_read(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str
) -> None:
    append(client, stream_name, 100)
    rows = read(spark, spark_cluster.metadata, streams=stream_name,
                startingOffsets=json.dumps({stream_name: 10}),
                endingOffsets=json.dumps({stream_name: 20}))
    assert sorted(r[1] for r in rows) == list(range(10, 20))
    rows = read(spark, spark_cluster.metadata, streams=stream_name,
                startingOffsets=json.dumps({stream_name: -2}),
                endingOffsets=json.dumps({stream_name: 5}))
    assert sorted(r[1] for r in rows) == list(range(5))
    for option, value in (("startingOffsets", 101), ("endingOffsets", 101)):
        with pytest.raises(Exception, match=f"option '{option}' asks for stream .* beyond"):
            read(spark, spark_cluster.metadata, streams=stream_name,
                 **{option: json.dumps({stream_name: value})})


def test_noop_entries_of_a_takeover_never_appear(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str
) -> None:
    append(client, stream_name, 5)
    append(client, stream_name, 5, start=5)  # a second writer: recovery writes a no-op
    info = client.stream_info(stream_name)
    assert info.lac >= 10  # 10 payloads and at least one no-op between them
    rows = read(spark, spark_cluster.metadata, streams=stream_name)
    assert sorted(r[2] for r in rows) == [payload(stream_name, i) for i in range(10)]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"streams": "x", "bogus": "1"}, "bogus"),
        ({"streams": "x", "startingOffsets": "{not json"}, "startingOffsets"),
        ({"streams": "x", "endingOffsets": "earliest"}, "endingOffsets"),
        ({"streams": "x", "maxEntriesPerTrigger": "10"}, "maxEntriesPerTrigger"),
        ({"streams": "x", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"streams": "x", "streamPattern": "x.*"}, "streams"),
        ({"streams": "no/slash"}, "streams"),
        ({"streamPattern": "("}, "streamPattern"),
        ({"streams": "x", "entriesPerPartition": "0"}, "entriesPerPartition"),
    ],
)
def test_bad_options_fail_naming_the_option(spark: Any, spark_cluster: Any,
                                            options: dict[str, str], named: str) -> None:
    with pytest.raises(Exception, match=named):
        read(spark, spark_cluster.metadata, **options)


def test_missing_metadata_and_missing_stream_fail_clearly(
    spark: Any, spark_cluster: Any, stream_name: str
) -> None:
    with pytest.raises(Exception, match="option 'metadata' is required"):
        spark.read.format("streamkeeper").option("streams", "x").load().collect()
    with pytest.raises(Exception, match=f"stream '{stream_name}' of option 'streams' does not"):
        read(spark, spark_cluster.metadata, streams=stream_name)
