"""The writer's appends between `append` and their answer: queued (not yet in the pipeline),
then unresolved (in the pipeline, not yet acknowledged), and the window that bounds both.

Append number `n` (a ticket) may enter once `n < completed + size`, `completed` counting the
appends acknowledged or failed (a Semaphore costs ~5 µs per append; this ~0.2 µs). Appends come
from any thread; everything else runs on the loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
from collections import deque
from collections.abc import Callable
from itertools import repeat

from stream.client.futures import INVALID_STATE, set_results
from stream.errors import StreamError
from stream.framing.prepare import AttributedPayload

AnyFuture = asyncio.Future[int] | concurrent.futures.Future[int]
_popleft = deque.popleft


class AppendWindow:
    """The appends of one writer not yet answered, and the room for more."""

    def __init__(self, size: int) -> None:
        self.size = size  # appends queued or unresolved at most
        # Appends not yet in the pipeline, from any thread, with their futures.
        self.queue: deque[tuple[bytes | AttributedPayload, AnyFuture]] = deque()
        self.tickets = itertools.count()
        self.completed = 0  # written on the loop thread only
        # Appends in the pipeline, not yet acknowledged: their futures in id order, the first
        # one's entry id beside them (ids are contiguous; no per-entry tuple).
        self.unresolved: deque[AnyFuture] = deque()
        self.unresolved_first_id = 0
        self._room_wanted = False  # a thread waits for room
        self._room_event = threading.Event()
        self._room = asyncio.Event()  # loop tasks wait for room
        self._room_waiters = 0
        self._acked = asyncio.Event()

    def has_room(self, ticket: int) -> bool:
        return ticket < self.completed + self.size

    def wait_room_threadsafe(self, ticket: int, check: Callable[[], None]) -> None:
        """Blocks the calling thread (not the loop's) until `ticket` may enter; `check` raises
        when the writer stopped meanwhile."""
        while ticket >= self.completed + self.size:
            check()
            self._room_wanted = True
            if ticket < self.completed + self.size:
                return
            # A wake-up lost between wait() and clear() costs at most this timeout.
            self._room_event.wait(0.01)
            self._room_event.clear()

    async def wait_room(self, ticket: int, check: Callable[[], None]) -> None:
        """Returns once `ticket` may enter (on the loop thread); `check` raises when the writer
        stopped meanwhile."""
        self._room_waiters += 1
        try:
            while ticket >= self.completed + self.size:
                check()
                self._room.clear()
                await self._room.wait()
        finally:
            self._room_waiters -= 1

    def completed_appends(self, count: int) -> None:
        """Counts `count` appends as done (acknowledged or failed): room in the window."""
        self.completed += count
        if self._room_wanted:
            self._room_wanted = False
            self._room_event.set()
        if self._room_waiters:
            self._room.set()

    def resolve(self, last_entry_id: int) -> None:
        """Resolves the futures of the unresolved appends up to `last_entry_id` (acknowledged)."""
        unresolved = self.unresolved
        first = self.unresolved_first_id
        count = min(last_entry_id + 1 - first, len(unresolved))
        if count > 0:
            # Taken off the deque and resolved in C-level loops (one lock for the run).
            set_results(map(_popleft, repeat(unresolved, count)), first)
            self.unresolved_first_id = first + count
            self.completed_appends(count)
        self._acked.set()

    def fail_unresolved(self, error: StreamError) -> None:
        """Fails the appends in the pipeline with `error`."""
        unresolved = self.unresolved
        count = len(unresolved)
        while unresolved:
            future = unresolved.popleft()
            try:
                future.set_exception(error)
            except INVALID_STATE:
                pass
        self.completed_appends(count)
        self._acked.set()

    def fail_queued(self, error: StreamError) -> None:
        """Fails the appends not yet in the pipeline with `error`."""
        queue = self.queue
        count = 0
        while queue:
            _, future = queue.popleft()
            try:
                future.set_exception(error)
            except INVALID_STATE:
                pass
            count += 1
        self.completed_appends(count)

    async def wait_answered(self, check: Callable[[], None]) -> None:
        """Returns once no append is queued or unresolved; `check` raises when the writer
        stopped (before each wait and at the end)."""
        while self.queue or self.unresolved:
            check()
            self._acked.clear()
            await self._acked.wait()
        check()
