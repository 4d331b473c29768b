"""The time the background services read: one port, so that the retention service, the
auditor, replication workers, scrub and the bookie reconciler run on the real clock in
production and on the simulator's virtual clock in a simulation.

The port is a superset of the client's `stream.client.ports.WallClock` (wall-clock `now_ms`), so
one object serves a service and the writers or takeovers it runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    """Wall-clock milliseconds (entry timestamps, fragment ages), a monotonic clock (intervals,
    backoffs, deadlines) and a sleep on that monotonic clock."""

    def now_ms(self) -> int:
        """Returns milliseconds since the Unix epoch."""
        ...

    def monotonic(self) -> float:
        """Returns seconds on a clock that never goes back (only differences mean anything)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Returns after `seconds` of `monotonic()` time."""
        ...


class SystemClock:
    """The real clocks: `time.time_ns`, `time.monotonic`, `asyncio.sleep`."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class LoopClock:
    """Monotonic time and sleeps on the running event loop's clock (virtual under simulation),
    wall time from `now_ms`."""

    def __init__(self, now_ms: Callable[[], int]) -> None:
        self._now_ms = now_ms

    def now_ms(self) -> int:
        return self._now_ms()

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
