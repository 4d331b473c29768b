"""ReadLac long polls: the futures of the polls waiting for a stream's LAC to move, woken when
the storage engine reports a new LAC (from any thread), bounded in number."""

from __future__ import annotations

import asyncio
import threading


class LacPolls:
    """The long polls of one bookie, on the event loop running when it is built; at most
    `max_waiters` wait at once (`full`)."""

    def __init__(self, max_waiters: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._max_waiters = max_waiters
        # Stream id -> the futures of its polls.
        self.waiters: dict[int, set[asyncio.Future[None]]] = {}
        self._count = 0

    @property
    def full(self) -> bool:
        """Whether no more poll may wait now."""
        return self._count >= self._max_waiters

    def notify(self, stream_id: int) -> None:
        """Wakes the polls of `stream_id` (its LAC moved); any thread may call it."""
        if threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self._wake, stream_id)
        else:
            self._wake(stream_id)

    def _wake(self, stream_id: int) -> None:
        waiters = self.waiters.pop(stream_id, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def wait(self, stream_id: int, timeout_s: float) -> None:
        """Returns when the LAC of `stream_id` may have moved, or after `timeout_s`."""
        fut: asyncio.Future[None] = self._loop.create_future()
        waiters = self.waiters.setdefault(stream_id, set())
        waiters.add(fut)
        self._count += 1
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            self._count -= 1
            # The set may have been popped (and replaced) by a wake-up meanwhile.
            current = self.waiters.get(stream_id)
            if current is not None:
                current.discard(fut)
                if not current:
                    del self.waiters[stream_id]
