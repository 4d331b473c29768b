"""Keys and headers in Spark: source rows carry `key` (null when absent) and, with
includeHeaders, `headers` in Kafka's shape; the sink writes `key` and `headers` columns; a
round trip stream -> Spark -> stream keeps them, on a real cluster and a real SparkSession."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from spark_connector.partition_reader import READ_OPTIONS, ROWS_PER_BATCH, read_range
from spark_connector.ranges import StreamRange
from spark_connector.schema import ARROW_HEADERS_SCHEMA, ARROW_SCHEMA
from stream.client import StreamClient

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def attributes(i: int) -> tuple[bytes | None, list[tuple[str, bytes]]]:
    """Entry `i`'s key and headers: none on even entries, a key on odd ones, headers (one
    name twice) on every third."""
    key = b"k%d" % (i % 5) if i % 2 else None
    headers = [("trace", b"t%d" % i), ("trace", b"")] if i % 3 == 0 and i % 2 else []
    return key, headers


def append_with_attributes(client: StreamClient, stream: str, count: int) -> None:
    client.create_stream(stream)
    with client.open_writer(stream) as writer:
        futures = []
        for i in range(count):
            key, headers = attributes(i)
            futures.append(writer.append_async(b"p%d" % i, key=key, headers=headers))
        writer.flush()
        for f in futures:
            f.result()


def expected_headers(i: int) -> list[tuple[str, bytes]] | None:
    return attributes(i)[1] or None


def test_source_rows_carry_key_and_with_include_headers_headers(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str
) -> None:
    append_with_attributes(client, stream_name, 300)
    plain = stream_name + "-plain"
    client.create_stream(plain)
    with client.open_writer(plain) as writer:
        writer.append(b"no attributes")
    reader = spark.read.format("streamkeeper").option("metadata", spark_cluster.metadata)
    frame = reader.option("streams", stream_name).load()
    assert frame.schema.simpleString() == (
        "struct<stream:string,entry_id:bigint,payload:binary,timestamp:timestamp,key:binary>"
    )
    rows = frame.orderBy("entry_id").collect()
    assert [(r.entry_id, r.key) for r in rows] == [(i, attributes(i)[0]) for i in range(300)]

    with_headers = (
        reader.option("streams", f"{stream_name},{plain}").option("includeHeaders", "true").load()
    )
    assert with_headers.schema.simpleString().endswith(
        ",key:binary,headers:array<struct<key:string,value:binary>>>"
    )
    rows = with_headers.where(f"stream = '{stream_name}'").orderBy("entry_id").collect()
    got = [
        (r.key, None if r.headers is None else [(h.key, bytes(h.value)) for h in r.headers])
        for r in rows
    ]
    assert got == [(attributes(i)[0], expected_headers(i)) for i in range(300)]
    # Kafka's idiom works on the column: the value of a header by name.
    traced = (
        with_headers.selectExpr(
            "entry_id", "filter(headers, h -> h.key = 'trace')[0].value AS trace"
        )
        .where("trace IS NOT NULL AND stream = '" + stream_name + "'")
        .collect()
    )
    assert sorted(r.entry_id for r in traced) == [i for i in range(300) if expected_headers(i)]
    (plain_row,) = with_headers.where(f"stream = '{plain}'").collect()
    assert (plain_row.key, plain_row.headers) == (None, None)


def test_partition_batches_have_the_exact_arrow_schema_with_or_without_headers(
    spark_cluster: Any, client: StreamClient, stream_name: str
) -> None:
    # The first request's entries, then the rest cut at ROWS_PER_BATCH rows.
    first = READ_OPTIONS.range_first_entries
    count = 3 + first + ROWS_PER_BATCH + 50
    append_with_attributes(client, stream_name, count)
    for include, schema in ((False, ARROW_SCHEMA), (True, ARROW_HEADERS_SCHEMA)):
        part = StreamRange(
            spark_cluster.metadata, stream_name, 3, count - 1, True, include_headers=include
        )
        batches = list(read_range(part))
        assert [b.num_rows for b in batches] == [first, ROWS_PER_BATCH, 50]
        assert all(b.schema.equals(schema) for b in batches)
        keys = [k for b in batches for k in b.column("key").to_pylist()]
        assert keys == [attributes(i)[0] for i in range(3, count)]
        if include:
            headers = [h for b in batches for h in b.column("headers").to_pylist()]
            assert headers == [
                None
                if expected_headers(i) is None
                else [{"key": n, "value": v} for n, v in attributes(i)[1]]
                for i in range(3, count)
            ]


def test_sink_writes_key_and_headers_columns_and_round_trips(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str, tmp_path: Path
) -> None:
    source, copy, derived = stream_name, stream_name + "-copy", stream_name + "-derived"
    append_with_attributes(client, source, 400)
    client.create_stream(copy)
    client.create_stream(derived)

    def stream_to(target: str, *columns: str) -> None:
        query = (
            spark.readStream.format("streamkeeper")
            .option("metadata", spark_cluster.metadata)
            .option("streams", source)
            .option("startingOffsets", "earliest")
            .option("includeHeaders", "true")
            .option("maxEntriesPerTrigger", "150")
            .load()
            .selectExpr(*columns)
            .writeStream.format("streamkeeper")
            .option("metadata", spark_cluster.metadata)
            .option("stream", target)
            .option("checkpointLocation", str(tmp_path / target))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        assert query.exception() is None

    # The source's own columns go back unchanged: stream -> Spark -> stream keeps them.
    stream_to(copy, "payload", "key", "headers")
    reader = client.open_reader(copy)
    copied = list(reader.read(0, reader.last_add_confirmed()))
    assert [(e.payload, e.key, e.headers) for e in copied] == [
        (b"p%d" % i, attributes(i)[0], tuple(attributes(i)[1])) for i in range(400)
    ]
    # Columns made in Spark: string key, headers built with Kafka's struct names, string values.
    stream_to(
        derived,
        "payload",
        "CAST(entry_id AS STRING) AS key",
        "array(named_struct('key', 'origin', 'value', stream)) AS headers",
    )
    reader = client.open_reader(derived)
    made = list(reader.read(0, reader.last_add_confirmed()))
    assert [(e.key, e.headers) for e in made] == [
        (b"%d" % i, (("origin", source.encode()),)) for i in range(400)
    ]


def test_the_sink_refuses_key_and_headers_columns_of_other_types(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str, tmp_path: Path
) -> None:
    client.create_stream(stream_name)
    for columns in (
        ("CAST(value AS STRING) AS payload", "value AS key"),
        ("CAST(value AS STRING) AS payload", "array('a') AS headers"),
    ):
        frame = spark.readStream.format("rate").load().selectExpr(*columns)
        with pytest.raises(Exception, match="streamkeeper sink's column"):
            query = (
                frame.writeStream.format("streamkeeper")
                .option("metadata", spark_cluster.metadata)
                .option("stream", stream_name)
                .option("checkpointLocation", str(tmp_path / columns[1].split()[-1]))
                .start()
            )
            try:
                query.awaitTermination(60)
                raise AssertionError(f"the query ran: {query.exception()}")
            finally:
                query.stop()
    assert client.stream_info(stream_name).lac == -1
