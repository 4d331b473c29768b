"""Waiting on the event loop for the journal's group commits.

A journal group's records share one `concurrent.futures.Future`, completed on the journal
thread. `asyncio.wrap_future` per Add batch would have the journal thread wake the event loop
once per batch (a `call_soon_threadsafe` and a self-pipe write each); `GroupWaits` wraps each
group future once, so the batches of a group are woken by one hand-over."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any


class GroupWaits:
    """Awaitables for journal group futures, one loop-side future per group (the latest)."""

    __slots__ = ("_group", "_waiter")

    def __init__(self) -> None:
        self._group: concurrent.futures.Future[Any] | None = None
        self._waiter: asyncio.Future[Any] | None = None

    async def wait(self, durable: concurrent.futures.Future[Any] | None) -> None:
        """Returns once `durable` (a journal group future, or None) completed; raises its
        error. Call on the event loop."""
        if durable is None:
            return
        if durable.done():
            durable.result()
            return
        # Shielded: a cancelled waiter (its Add stream ended) must not cancel the shared
        # future under the other batches of the group.
        await asyncio.shield(self._wrapped(durable))

    def waiter(self, durable: concurrent.futures.Future[Any] | None) -> asyncio.Future[Any] | None:
        """Returns the loop-side future of `durable` (a journal group future) for done
        callbacks, shared by the batches of its group; None when there is nothing to wait
        for (None, or done already). Callers must not cancel it. Call on the event loop."""
        if durable is None or durable.done():
            return None
        return self._wrapped(durable)

    def _wrapped(self, durable: concurrent.futures.Future[Any]) -> asyncio.Future[Any]:
        waiter = self._waiter
        if durable is not self._group or waiter is None:
            # Groups complete in order: only the newest is worth remembering.
            self._group = durable
            waiter = self._waiter = asyncio.wrap_future(durable)
            # A shield whose caller was cancelled stops watching `waiter`: when every batch
            # of the group went away (their streams ended) before the journal failed it, its
            # error is for nobody; the journal reports its own failure.
            waiter.add_done_callback(_mark_retrieved)
        return waiter


def _mark_retrieved(waiter: asyncio.Future[Any]) -> None:
    if not waiter.cancelled():
        waiter.exception()
