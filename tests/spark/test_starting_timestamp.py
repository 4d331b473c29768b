"""`startingTimestamp` and `startingOffsetsByTimestamp` on a real cluster and local Spark:
each stream starts at its first entry stamped at or after the time; a stream with none fails
the query or starts at its end (`startingOffsetsByTimestampStrategy`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from stream.client import StreamClient
from tests.integration.test_seek_time import ManualClock
from tests.spark.conftest import payload
from tests.spark.session import start_query
from tests.spark.test_batch_read import read
from tests.spark.test_streaming_read import output, run_available_now

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BASE_MS = 1_700_000_000_000


@pytest.fixture
def timed(spark_cluster: Any, stream_name: str) -> Iterator[tuple[str, str, str]]:
    """Three streams, stamped by a clock the test sets: `old` holds 50 entries at
    BASE_MS + 500; `mid` 200 entries, 50 each at BASE_MS + 1000, + 2000, + 3000, + 4000;
    `new` 50 entries at BASE_MS + 5000."""
    old, mid, new = (f"{stream_name}-{tag}" for tag in ("old", "mid", "new"))
    clock = ManualClock(BASE_MS)
    with StreamClient.connect(spark_cluster.metadata, clock=clock) as client:
        for name, stamps in ((old, [500]), (mid, [1000, 2000, 3000, 4000]), (new, [5000])):
            client.create_stream(name)
            with client.open_writer(name) as writer:
                for chunk, offset_ms in enumerate(stamps):
                    clock.now = BASE_MS + offset_ms
                    futures = [
                        writer.append_async(payload(name, i))
                        for i in range(chunk * 50, chunk * 50 + 50)
                    ]
                    writer.flush()
                    for f in futures:
                        f.result()
        yield old, mid, new


def ids(rows: list[tuple[str, int, bytes]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for stream, entry_id, _ in sorted(rows):
        out.setdefault(stream, []).append(entry_id)
    return out


def test_starting_timestamp_starts_each_stream_at_its_first_entry_at_or_after_the_time(
    spark: Any, spark_cluster: Any, timed: tuple[str, str, str], tmp_path: Path
) -> None:
    old, mid, new = timed
    options = {
        "streams": f"{old},{mid},{new}",
        "startingTimestamp": str(BASE_MS + 3000),
        "maxEntriesPerTrigger": "70",
    }
    # `old` has no entry that late: by default the query fails, naming the option and stream.
    query = start_query(
        spark, spark_cluster.metadata, tmp_path / "a", {"availableNow": True}, **options
    )
    with pytest.raises(Exception, match=f"startingTimestamp.*{old}.*no entry"):
        query.awaitTermination(120)

    run_available_now(
        spark,
        spark_cluster.metadata,
        tmp_path / "b",
        startingOffsetsByTimestampStrategy="latest",
        **options,
    )
    assert ids(output(spark, tmp_path / "b")) == {
        mid: list(range(100, 200)),  # the first stamped BASE_MS + 3000 on
        new: list(range(50)),
    }
    # `old` started at its end: what comes later is read.
    with StreamClient.connect(spark_cluster.metadata) as client, client.open_writer(old) as w:
        w.append(payload(old, 50))
    run_available_now(
        spark,
        spark_cluster.metadata,
        tmp_path / "b",
        startingOffsetsByTimestampStrategy="latest",
        **options,
    )
    assert [p for s, _, p in output(spark, tmp_path / "b") if s == old] == [payload(old, 50)]


def test_starting_offsets_by_timestamp_per_stream_in_a_batch_read(
    spark: Any, spark_cluster: Any, timed: tuple[str, str, str]
) -> None:
    old, mid, new = timed
    streams = f"{old},{mid},{new}"
    rows = read(
        spark,
        spark_cluster.metadata,
        streams=streams,
        startingOffsetsByTimestamp=json.dumps({mid: BASE_MS + 2500, old: BASE_MS + 500}),
        startingOffsets=json.dumps({new: 20}),  # streams the times leave out
    )
    assert ids(rows) == {
        old: list(range(50)),
        mid: list(range(100, 200)),
        new: list(range(20, 50)),
    }
    late = json.dumps({mid: BASE_MS + 4001})
    with pytest.raises(Exception, match=f"startingOffsetsByTimestamp.*{mid}.*no entry"):
        read(spark, spark_cluster.metadata, streams=streams, startingOffsetsByTimestamp=late)
    rows = read(
        spark,
        spark_cluster.metadata,
        streams=streams,
        startingOffsetsByTimestamp=late,
        startingOffsetsByTimestampStrategy="LATEST",
    )
    assert mid not in ids(rows) and len(ids(rows)[old]) == 50
