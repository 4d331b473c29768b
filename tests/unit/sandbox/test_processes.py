"""Reading a process's CPU time from /proc, as the benchmarks do."""

from __future__ import annotations

import os
import time

from stream.sandbox.processes import cpu_seconds


def test_cpu_seconds_follows_the_process_cpu_time() -> None:
    before = cpu_seconds(os.getpid())
    started = time.process_time()
    while time.process_time() - started < 0.3:
        pass
    used = cpu_seconds(os.getpid()) - before
    # /proc counts in clock ticks (1/100 s): the 0.3 s of work shows within a few ticks.
    assert 0.2 <= used <= 1.0
