"""`streamPattern` picks up streams created while a query runs; retention trimming behind a
stopped query fails it with `failOnDataLoss=true` and is skipped with `false`."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from stream.client import StreamClient
from tests.spark.conftest import append, payload
from tests.spark.session import start_query
from tests.spark.test_streaming_read import output, run_available_now

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_stream_pattern_picks_up_a_stream_created_after_the_query_started(
    spark: Any, spark_cluster: Any, client: StreamClient, tmp_path: Path
) -> None:
    prefix = f"p{uuid.uuid4().hex[:8]}"
    first, second, unrelated = f"{prefix}-a", f"{prefix}-b", f"x{prefix}-c"
    append(client, first, 10)
    append(client, unrelated, 5)
    query = start_query(
        spark,
        spark_cluster.metadata,
        tmp_path,
        {"processingTime": "100 milliseconds"},
        streamPattern=f"{prefix}-.*",
        startingOffsets="earliest",
    )
    try:
        deadline = time.monotonic() + 90
        while len(output(spark, tmp_path)) < 10 and time.monotonic() < deadline:
            time.sleep(0.3)
        append(client, second, 7)
        while len(output(spark, tmp_path)) < 17 and time.monotonic() < deadline:
            assert query.exception() is None, str(query.exception())
            time.sleep(0.3)
    finally:
        query.stop()
    rows = output(spark, tmp_path)
    assert sorted((r[0], r[2]) for r in rows) == sorted(
        [(first, payload(first, i)) for i in range(10)]
        + [(second, payload(second, i)) for i in range(7)]
    )


def test_trimming_behind_a_stopped_query_fails_it_or_is_skipped(
    spark: Any, spark_cluster: Any, client: StreamClient, stream_name: str, tmp_path: Path
) -> None:
    append(client, stream_name, 300, fragment_max_entries=100)
    run_available_now(
        spark, spark_cluster.metadata, tmp_path, streams=stream_name, startingOffsets="earliest"
    )
    assert len(output(spark, tmp_path)) == 300
    append(client, stream_name, 300, start=300, fragment_max_entries=100)
    first_retained = client.trim(stream_name, before_entry_id=450)
    assert 300 < first_retained <= 450

    query = start_query(
        spark,
        spark_cluster.metadata,
        tmp_path,
        {"availableNow": True},
        streams=stream_name,
        startingOffsets="earliest",
    )
    with pytest.raises(Exception, match="failOnDataLoss=false") as failed:
        query.awaitTermination(120)
    assert f"of stream '{stream_name}' were trimmed" in str(failed.value)
    assert len(output(spark, tmp_path)) == 300

    run_available_now(
        spark,
        spark_cluster.metadata,
        tmp_path,
        streams=stream_name,
        startingOffsets="earliest",
        failOnDataLoss="false",
    )
    kept = [r[1] for r in output(spark, tmp_path)]
    assert len(kept) == len(set(kept))
    reader = client.open_reader(stream_name)
    retained = [e.entry_id for e in reader.read(first_retained, reader.last_add_confirmed())]
    assert sorted(kept) == list(range(300)) + retained


def test_stream_pattern_matching_nothing_yet_waits_for_the_first_stream(
    spark: Any, spark_cluster: Any, client: StreamClient, tmp_path: Path
) -> None:
    name = f"q{uuid.uuid4().hex[:8]}-late"
    query = start_query(
        spark,
        spark_cluster.metadata,
        tmp_path,
        {"processingTime": "100 milliseconds"},
        streamPattern=name.replace("-late", "-.*"),
    )
    try:
        deadline = time.monotonic() + 60
        while not query.recentProgress and time.monotonic() < deadline:
            time.sleep(0.2)
        append(client, name, 5)
        while len(output(spark, tmp_path)) < 5 and time.monotonic() < deadline:
            assert query.exception() is None, str(query.exception())
            time.sleep(0.3)
    finally:
        query.stop()
    assert sorted(r[2] for r in output(spark, tmp_path)) == [payload(name, i) for i in range(5)]
