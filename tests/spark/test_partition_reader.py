"""The executor side without Spark: one `StreamRange` read from a real cluster into Arrow
batches of the schema's exact types, ranges that retention trimmed, a range whose stream
was deleted and created again after the driver planned it, and a query's reads (the driver's
source runner, a task) made without gRPC."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from spark_connector.catalog import StreamCatalog
from spark_connector.errors import DataLossError
from spark_connector.options import parse_source_options
from spark_connector.partition_reader import READ_OPTIONS, ROWS_PER_BATCH, read_range
from spark_connector.ranges import StreamRange
from spark_connector.schema import ARROW_SCHEMA
from stream.client import StreamClient
from stream.client.grpc_transport import GrpcTransport
from stream.client.zk_metadata import ZkMetadata
from stream.errors import StreamNotFoundError
from tests.call_counts import count_calls
from tests.spark.conftest import append, payload

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_a_range_reads_as_arrow_batches_of_the_schema(
    spark_cluster: Any, client: StreamClient, stream_name: str
) -> None:
    # The first answer holds the first request's entries; the next, the rest, cut into
    # batches of at most ROWS_PER_BATCH rows.
    first = READ_OPTIONS.range_first_entries
    count = 5 + first + ROWS_PER_BATCH + 100
    append(client, stream_name, count)
    batches = list(read_range(StreamRange(spark_cluster.metadata, stream_name, 5, count - 1, True)))
    assert [b.num_rows for b in batches] == [first, ROWS_PER_BATCH, 100]
    assert all(b.schema.equals(ARROW_SCHEMA) for b in batches)
    ids = [i for b in batches for i in b.column("entry_id").to_pylist()]
    assert ids == list(range(5, count))
    assert batches[0].column("payload")[0].as_py() == payload(stream_name, 5)
    assert set(batches[0].column("stream").to_pylist()) == {stream_name}


def test_a_trimmed_range_fails_or_continues_at_the_first_retained_entry(
    spark_cluster: Any, client: StreamClient, stream_name: str
) -> None:
    append(client, stream_name, 300, fragment_max_entries=100)
    first_retained = client.trim(stream_name, before_entry_id=250)
    assert first_retained == 200
    with pytest.raises(DataLossError, match=r"entries 50\.\.199 .* were trimmed"):
        list(read_range(StreamRange(spark_cluster.metadata, stream_name, 50, 299, True)))
    part = StreamRange(spark_cluster.metadata, stream_name, 50, 299, False)
    ids = [i for b in read_range(part) for i in b.column("entry_id").to_pylist()]
    assert ids == list(range(200, 300))
    part = StreamRange(spark_cluster.metadata, stream_name, 50, 150, False)
    assert list(read_range(part)) == []


def test_a_part_planned_on_a_stream_deleted_and_created_again_is_not_read_from_the_new_one(
    spark_cluster: Any, client: StreamClient, stream_name: str
) -> None:
    append(client, stream_name, 50)
    options = parse_source_options(
        {"metadata": spark_cluster.metadata, "streams": stream_name}, streaming=True
    )
    catalog = StreamCatalog(client, options)
    bounds = catalog.all_bounds(missing_ok=False)
    (part,) = catalog.plan({stream_name: 0}, {stream_name: 50}, bounds)
    assert part.stream_id == client.stream_info(stream_name).stream_id
    assert sum(b.num_rows for b in read_range(part)) == 50
    client.delete_stream(stream_name)
    append(client, stream_name, 50, start=1000)  # the same name, another stream
    with pytest.raises(StreamNotFoundError) as gone:
        list(read_range(part))
    assert gone.value.context["stream_id"] == part.stream_id
    renewed = dataclasses.replace(part, stream_id=client.stream_info(stream_name).stream_id)
    rows = [p for b in read_range(renewed) for p in b.column("payload").to_pylist()]
    assert rows == [payload(stream_name, i) for i in range(1000, 1050)]


def test_a_task_reads_its_part_after_one_metadata_snapshot_and_no_lac_read(
    spark_cluster: Any, client: StreamClient, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The part names its stream's id and ends at or below an LAC the driver read: the task
    # opens the stream by that id with that LAC, and reads without asking again.
    append(client, stream_name, 50)
    options = parse_source_options(
        {"metadata": spark_cluster.metadata, "streams": stream_name}, streaming=True
    )
    catalog = StreamCatalog(client, options)
    (part,) = catalog.plan(
        {stream_name: 0}, {stream_name: 50}, catalog.all_bounds(missing_ok=False)
    )
    calls = count_calls(
        monkeypatch,
        (GrpcTransport, "read_lac"),
        (ZkMetadata, "get_snapshot"),
        (ZkMetadata, "get_stream"),
    )
    assert sum(b.num_rows for b in read_range(part)) == 50
    assert calls == Counter(get_snapshot=1)


# What Spark's driver source runner does for an availableNow query (a fresh process per query),
# then a task's read of each part: every read goes over the bookies' data ports.
_RUNNER = """
import json, sys
from spark_connector.schema import SCHEMA
from spark_connector.source import StreamkeeperDataSource
source = StreamkeeperDataSource(json.loads(sys.argv[1]))
reader = source.streamReader(SCHEMA)
reader.prepareForTriggerAvailableNow()
start = reader.initialOffset()
end = reader.latestOffset(start, reader.getDefaultReadLimit())
rows = sum(b.num_rows for part in reader.partitions(start, end) for b in reader.read(part))
print(json.dumps({"grpc": "grpc" in sys.modules, "end": end, "rows": rows}))
"""


def test_a_querys_runner_and_tasks_read_without_grpc(
    spark_cluster: Any, client: StreamClient, stream_name: str
) -> None:
    # The stream's fragment is open: its LAC is asked of its bookies (ReadLac over the data
    # port). Importing gRPC alone took about 27 ms of each query's start.
    append(client, stream_name, 30)
    options = {
        "metadata": spark_cluster.metadata,
        "streams": stream_name,
        "startingOffsets": "earliest",
    }
    run = subprocess.run(
        [sys.executable, "-c", _RUNNER, json.dumps(options)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(run.stdout) == {"grpc": False, "end": {stream_name: 30}, "rows": 30}
