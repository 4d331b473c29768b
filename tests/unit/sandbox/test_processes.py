"""Reading a process's CPU time, disk writes and peak memory from /proc, as the benchmarks
do."""

from __future__ import annotations

import os
import time
from pathlib import Path

from stream.sandbox.processes import cpu_seconds, peak_rss_bytes, write_bytes


def test_cpu_seconds_follows_the_process_cpu_time() -> None:
    before = cpu_seconds(os.getpid())
    started = time.process_time()
    while time.process_time() - started < 0.3:
        pass
    used = cpu_seconds(os.getpid()) - before
    # /proc counts in clock ticks (1/100 s): the 0.3 s of work shows within a few ticks.
    assert 0.2 <= used <= 1.0


def test_write_bytes_counts_what_reached_the_disk(tmp_path: Path) -> None:
    before = write_bytes(os.getpid())
    fd = os.open(tmp_path / "data", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"w" * (4 << 20))
        os.fdatasync(fd)  # written back by this process, not later by the kernel's flusher
    finally:
        os.close(fd)
    assert write_bytes(os.getpid()) - before >= 4 << 20


def test_peak_rss_keeps_the_largest_resident_set() -> None:
    before = peak_rss_bytes(os.getpid())
    block = b"m" * (before + (64 << 20))  # every page written: resident
    during = peak_rss_bytes(os.getpid())
    del block
    after = peak_rss_bytes(os.getpid())
    # The kernel's RSS counters lag by some pages per thread: a margin, not the exact size.
    # Freeing the block does not lower the figure: a high-water mark, not the resident set.
    assert min(during, after) >= before + (32 << 20)
