"""A deterministic asyncio event loop on virtual time, for the simulator.

The client's writer, reader and recovery are ordinary asyncio code whose I/O (bookie transport,
metadata store, clock) is passed in. Under simulation every I/O object is in memory, so nothing
ever waits on a file descriptor: the loop's selector never blocks, it advances the virtual clock
to the next timer instead. asyncio's ready queue is FIFO, so one seed gives one schedule.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _VirtualSelector(selectors.BaseSelector):
    """A selector with nothing to watch: `select(timeout)` moves virtual time forward."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._map: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        # The loop registers its self-pipe; keep it but never report it ready.
        key = selectors.SelectorKey(fileobj, 0, events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError("simulated loop is idle with no timer: the simulation deadlocked")
        if timeout > 0:
            self._clock.advance(timeout)
        return []

    def get_map(self) -> dict[Any, selectors.SelectorKey]:
        return self._map

    def close(self) -> None:
        self._map.clear()


class VirtualClock:
    """Virtual seconds since the start of a simulation."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def advance(self, seconds: float) -> None:
        self.now_s += seconds

    def time(self) -> float:
        return self.now_s


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` is a `VirtualClock` and which never sleeps for real."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock or VirtualClock()
        super().__init__(selector=_VirtualSelector(self.clock))
        # asyncio compares timers against time() with this granularity; virtual time is exact.
        self._clock_resolution = 1e-9

    def time(self) -> float:
        # Read the attribute directly: asyncio asks for the time several times per callback.
        return self.clock.now_s


# Cancelled tasks may start new ones (a writer's `finally` restarting its roll): this many
# rounds of cancelling end any run's.
_DRAIN_ROUNDS = 20


def drain(loop: asyncio.AbstractEventLoop) -> None:
    """Ends what a run left on `loop`, before it is closed: cancels every task, again while
    cancelled tasks start new ones, and closes the async generators left suspended (a
    reader's range read cancelled midway). Left to the garbage collector, they would be
    finalized later, during another run, and Python would print a warning about each (a
    library prints nothing)."""
    for _ in range(_DRAIN_ROUNDS):
        pending = asyncio.all_tasks(loop)
        if not pending:
            break
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())


def close_when_done(task: asyncio.Future[Any], handed: Awaitable[Any]) -> None:
    """Closes `handed`, a coroutine that `task`'s coroutine was handed to await, once `task`
    is done. A task cancelled before its first step never awaits what it was handed, and
    Python warns about a coroutine dropped unawaited; closing one that ran is a no-op (it
    ended with the task that awaited it), and closing an unstarted one warns of nothing."""
    if isinstance(handed, Coroutine):
        task.add_done_callback(lambda _: handed.close())


def run_simulated(coro: Coroutine[Any, Any, T], clock: VirtualClock | None = None) -> T:
    """Runs `coro` to completion on a fresh virtual-time loop and returns its result; what it
    left running is cancelled (`drain`)."""
    loop = VirtualTimeLoop(clock)
    try:
        result = loop.run_until_complete(coro)
        drain(loop)
        return result
    finally:
        loop.close()
