"""Reading by time on real processes (docs/design.md "Time"): entry timestamps never go
backwards within a stream, whatever the writers' clocks say, and `seek_time` agrees with a
brute-force scan of the stream in a logarithmic number of reads.

The big stream has 100,000 entries over 50 fragments (`STREAMKEEPER_SEEK_ENTRIES=N` writes N
entries instead, still over 50 fragments)."""

from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import datetime
import itertools
import json
import logging
import math
import os
import random
import threading
import time
from collections.abc import Generator, Iterator
from typing import cast

import pytest
import structlog

from stream.client import StreamClient
from stream.client import reader as reader_module
from stream.client.entry import Entry
from stream.clock import SystemClock
from stream.logs import use_standard_logging
from stream.sandbox.cluster import SandboxCluster
from tests.integration.cli_support import streamctl

pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]

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


class ManualClock:
    """A clock the test sets: the time every entry appended meanwhile is stamped at, unless
    the stream's time is already later."""

    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now


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


def test_seek_time_matches_a_scan_with_skewed_writer_clocks(
    cluster: SandboxCluster, caplog: pytest.LogCaptureFixture, library_logging: None
) -> None:
    with StreamClient.connect(cluster.metadata) as client:
        _check_seeks(cluster, client, caplog)


def _check_seeks(
    cluster: SandboxCluster, client: StreamClient, caplog: pytest.LogCaptureFixture
) -> None:
    total = int(os.environ.get("STREAMKEEPER_SEEK_ENTRIES", "100000"))
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


def _iso_ms(text: str) -> int:
    return int(datetime.datetime.fromisoformat(text).timestamp() * 1000)


def test_time_stands_still_for_a_writer_whose_clock_is_behind(cluster: SandboxCluster) -> None:
    ten = _iso_ms("2026-11-24T10:00Z")
    clock = ManualClock(ten + HOUR_MS)  # the first writer's clock is an hour ahead
    with StreamClient.connect(cluster.metadata, clock=clock) as client:
        client.create_stream("behind", fragment_max_entries=150)
        with client.open_writer("behind") as ahead:
            for i in range(100):
                if i == 50:
                    ahead.flush()
                    clock.now += 5
                ahead.append_async(b"ahead-%d" % i)
        clock.now = ten  # the next writer's clock is right: an hour behind the stream
        with client.open_writer("behind") as late:
            for i in range(100):
                late.append_async(b"late-%d" % i)
            late.flush()
            clock.now = ten + 2 * HOUR_MS  # its clock passes the stream's time
            late.append(b"caught up")
        info = client.stream_info("behind")
        reader = client.open_reader("behind")
        entries = list(reader.read(0, info.lac))
        stamps = [e.timestamp_ms for e in entries]
        assert stamps == sorted(stamps)
        # The late writer kept stamping the stream's time until its clock caught up.
        plateau = ten + HOUR_MS + 5
        assert stamps[:200] == [ten + HOUR_MS] * 50 + [plateau] * 150
        assert stamps[200] == ten + 2 * HOUR_MS
        # The fragment closed in the second term records the first term's first entry.
        closed = info.fragments[0]
        assert closed.last_entry_id is not None
        assert (closed.first_timestamp_ms, closed.last_timestamp_ms) == (ten + HOUR_MS, plateau)
        # Reading by time: the plateau starts at its first entry; later times at the last.
        assert reader.seek_time(ten) == 0
        assert reader.seek_time(ten + HOUR_MS + 1) == entries[50].entry_id
        assert reader.seek_time(plateau) == entries[50].entry_id
        assert reader.seek_time(plateau + 1) == entries[200].entry_id
        assert reader.seek_time(ten + 3 * HOUR_MS) == info.lac + 1
        tailed = reader.tail(start_time_ms=plateau + 1, timeout_s=0.5)
        assert [e.payload for e in tailed] == [b"caught up"]


def test_streamctl_tail_from_time(cluster: SandboxCluster) -> None:
    metadata = cluster.metadata
    now_ms = SystemClock().now_ms()
    clock = ManualClock(_iso_ms("2026-11-24T09:00Z"))
    with StreamClient.connect(metadata, clock=clock) as client:
        client.create_stream("hours")
        for text in ("09:00", "10:00", "11:00"):
            clock.now = _iso_ms(f"2026-11-24T{text}Z")
            with client.open_writer("hours") as writer:
                writer.append(text.encode())
        client.create_stream("recent")
        for offset_ms, text in ((2 * HOUR_MS, "old"), (HOUR_MS // 2, "new")):
            clock.now = now_ms - offset_ms
            with client.open_writer("recent") as writer:
                writer.append(text.encode())

    tailed = streamctl(
        metadata, "tail", "hours", "--from-time", "2026-11-24T10:00Z", "--timeout", "0.5"
    )
    assert tailed.returncode == 0, tailed.stderr
    assert tailed.stdout.splitlines() == ["10:00", "11:00"]
    as_json = streamctl(
        metadata, "tail", "hours", "--from-time", "2026-11-24T10:30", "--timeout", "0.5",
        "--output", "json",
    )  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    lines = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [(e["payload"], e["timestamp_ms"]) for e in lines] == [
        ("11:00", _iso_ms("2026-11-24T11:00Z"))
    ]
    assert lines[0]["timestamp"] == "2026-11-24T11:00:00+00:00"
    relative = streamctl(metadata, "tail", "recent", "--from-time", "-1h", "--timeout", "0.5")
    assert relative.returncode == 0, relative.stderr
    assert relative.stdout.splitlines() == ["new"]
    bad = streamctl(metadata, "tail", "recent", "--from-time", "an hour ago")
    assert bad.returncode == 2
    assert "--from-time" in bad.stderr


class _Seen(logging.Handler):
    """Sets `event` once a record of the structlog event `name` is logged."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.DEBUG)
        self.name_wanted = name
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict) and record.msg.get("event") == self.name_wanted:
            self.event.set()


@pytest.fixture
def library_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """structlog as a library user gets it (events to the standard loggers, nothing filtered
    before them), whatever an earlier test's in-process `streamctl` main() configured (its
    loggers cache their first configuration: the reader gets a fresh one); restored after."""
    saved = structlog.get_config()
    structlog.reset_defaults()
    use_standard_logging()
    monkeypatch.setattr(reader_module, "log", structlog.get_logger(reader_module.__name__))
    try:
        yield
    finally:
        structlog.configure(**saved)


def test_tail_from_a_time_after_every_entry_waits_for_entries_that_late(
    cluster: SandboxCluster, library_logging: None
) -> None:
    ten = _iso_ms("2026-11-24T10:00Z")
    clock = ManualClock(ten)
    logger = logging.getLogger("stream.client.reader")
    seen = _Seen("reader.seek_time")
    level = logger.level
    logger.addHandler(seen)
    logger.setLevel(logging.DEBUG)
    try:
        with (
            StreamClient.connect(cluster.metadata, clock=clock) as client,
            concurrent.futures.ThreadPoolExecutor(1) as pool,
        ):
            client.create_stream("later")
            with client.open_writer("later") as writer:
                writer.append(b"early")
                reader = client.open_reader("later")

                def first_entry() -> bytes:
                    tail = reader.tail(start_time_ms=ten + HOUR_MS, timeout_s=60)
                    with contextlib.closing(cast(Generator[Entry, None, None], tail)):
                        return next(tail).payload

                got = pool.submit(first_entry)
                # The tail sought past every entry before these are appended.
                assert seen.event.wait(60)
                clock.now = ten + 1
                writer.append(b"still early")
                clock.now = ten + HOUR_MS
                writer.append(b"on time")
                assert got.result(60) == b"on time"
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)
