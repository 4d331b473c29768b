"""Reading by time on real processes (docs/design.md "Time"): entry timestamps never go
backwards within a stream, whatever the writers' clocks say, and `seek_time` agrees with a
brute-force scan of the stream in a logarithmic number of reads.

The big stream (`STREAMKEEPER_SEEK_ENTRIES`, default 20,000 entries; the 100,000-entry run is
`STREAMKEEPER_SEEK_ENTRIES=100000`) keeps 50 fragments whatever its size."""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import os
import random
import time
from collections.abc import Iterator

import pytest

from stream.client import StreamClient
from stream.client.ports import SystemClock
from stream.sandbox.cluster import SandboxCluster

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
# Clock offsets of the writers that take the stream over one after another: ahead, behind
# (time then stands still), far behind, in step again.
SKEWS_MS = [0, -HOUR_MS, 2 * HOUR_MS, -24 * HOUR_MS, 30_000, -30_000, 5 * HOUR_MS, 0, -1, 1]
FRAGMENTS = 50
SEEKS = 1000


class SkewedClock:
    """The wall clock moved by `offset_ms`: a writer whose clock is ahead or behind."""

    def __init__(self, offset_ms: int) -> None:
        self._offset_ms = offset_ms
        self._system = SystemClock()

    def now_ms(self) -> int:
        return self._system.now_ms() + self._offset_ms


def _write(metadata: str, stream: str, offset_ms: int, count: int, tag: int) -> None:
    """One writer with a skewed clock: takes the stream over, appends `count` entries with many
    in flight, closes."""
    with (
        StreamClient.connect(metadata, clock=SkewedClock(offset_ms)) as client,
        client.open_writer(stream) as writer,
    ):
        for i in range(count):
            writer.append_async(b"%d-%d" % (tag, i))
        writer.flush()


def _scan(client: StreamClient, stream: str) -> tuple[list[int], list[int], int]:
    """Returns every data entry's id and timestamp, and the LAC, read in one pass."""
    reader = client.open_reader(stream)
    lac = reader.last_add_confirmed()
    ids: list[int] = []
    stamps: list[int] = []
    for columns in reader.read_columns(0, lac):
        ids.extend(columns.ids)
        stamps.extend(columns.timestamps_ms)
    return ids, stamps, lac


def _brute_force(ids: list[int], stamps: list[int], end: int, times: list[int]) -> dict[int, int]:
    """Returns, for each time, the id of the first entry (in stream order) stamped at or after
    it, `end` when none: a scan that assumes nothing about the order of the timestamps (the
    first entry reaching a time is where the running maximum first reaches it)."""
    running = list(itertools.accumulate(stamps, max))
    return {t: ids[i] if (i := bisect.bisect_left(running, t)) < len(ids) else end for t in times}


@pytest.fixture
def client(cluster: SandboxCluster) -> Iterator[StreamClient]:
    c = StreamClient.connect(cluster.metadata)
    try:
        yield c
    finally:
        c.close()


def test_seek_time_matches_a_scan_with_skewed_writer_clocks(
    cluster: SandboxCluster, client: StreamClient, caplog: pytest.LogCaptureFixture
) -> None:
    total = int(os.environ.get("STREAMKEEPER_SEEK_ENTRIES", "20000"))
    per_writer = total // len(SKEWS_MS)
    client.create_stream("clocks", fragment_max_entries=total // FRAGMENTS)
    started = time.monotonic()
    for tag, offset_ms in enumerate(SKEWS_MS):
        _write(cluster.metadata, "clocks", offset_ms, per_writer, tag)
    written_s = time.monotonic() - started

    ids, stamps, lac = _scan(client, "clocks")
    assert len(ids) == per_writer * len(SKEWS_MS)
    assert stamps == sorted(stamps), "timestamps went backwards"
    fragments = client.stream_info("clocks").fragments
    assert len(fragments) >= FRAGMENTS
    for fragment in fragments[:-1]:
        # Every closed fragment records its first and last timestamp, and they bound its
        # entries.
        assert fragment.first_timestamp_ms is not None and fragment.last_timestamp_ms is not None
        assert fragment.last_entry_id is not None
        low = bisect.bisect_left(ids, fragment.first_entry_id)
        high = bisect.bisect_right(ids, fragment.last_entry_id)
        inside = stamps[low:high]
        assert fragment.first_timestamp_ms <= min(inside)
        assert fragment.last_timestamp_ms >= max(inside)

    rng = random.Random(19)
    times = [0, stamps[0], stamps[-1], stamps[-1] + 1]
    while len(times) < SEEKS:
        if rng.random() < 0.5:
            times.append(rng.choice(stamps) + rng.choice((-1, 0, 1)))
        else:
            times.append(rng.randint(stamps[0] - 10_000, stamps[-1] + 10_000))
    expected = _brute_force(ids, stamps, lac + 1, times)

    reader = client.open_reader("clocks")
    bound = 2 * math.log2(len(ids)) + 2
    reads: list[int] = []
    started = time.monotonic()
    with caplog.at_level(logging.DEBUG, logger="stream.client.reader"):
        for t in times:
            assert reader.seek_time(t) == expected[t], f"time {t}"
            reads.append(reader.last_seek_reads)
    seek_s = time.monotonic() - started
    assert max(reads) <= bound, f"a seek took {max(reads)} reads, more than {bound:.0f}"
    logged = [
        r.msg["reads"]
        for r in caplog.records
        if isinstance(r.msg, dict) and r.msg.get("event") == "reader.seek_time"
    ]
    assert logged == reads
    print(
        f"\n{len(ids)} entries, {len(fragments)} fragments: written in {written_s:.1f} s; "
        f"{len(times)} seeks in {seek_s:.1f} s, reads per seek mean "
        f"{sum(reads) / len(reads):.1f}, max {max(reads)} (bound {bound:.0f})"
    )
