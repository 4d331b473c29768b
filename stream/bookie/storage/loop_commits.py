"""The journal's group commits on the bookie's event loop (`journal_thread = false`).

A journal thread costs each group two hand-offs between threads: the event loop wakes it for
the group's records, and it wakes the event loop with the group's sync. On the bench machine
each hand-off is a sleep and a wake-up on another CPU (21-114 us of CPU there) and a contest
for the GIL. Here the loop commits a group itself, between its turns: the first record of a
group schedules the commit, so every batch received in the same turn joins the group. The
group's write and fdatasync release the GIL, so the flusher runs meanwhile, but the loop waits
for them, as Redis's `appendfsync always` does; `journal_thread = true` keeps the thread for
disks whose sync takes milliseconds. The simulator runs its bookies' journals the same way
(`commit_journal` from the loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from stream.bookie.storage.journal import Journal


class LoopCommits:
    """Commits `journal` (started without its thread) on `loop`; made on the loop's thread."""

    __slots__ = ("_armed", "_journal", "_loop", "_thread")

    def __init__(self, journal: Journal, loop: asyncio.AbstractEventLoop) -> None:
        self._journal = journal
        self._loop = loop
        self._thread = threading.get_ident()  # the loop's: the only one that commits
        self._armed = False

    def schedule(self) -> None:
        """Schedules a commit of the pending records on the loop, unless one is scheduled and
        has not started; called when a group starts (an append on the loop's thread, a
        checkpoint's mark on the flusher's)."""
        if self._armed:
            return
        self._armed = True
        if threading.get_ident() == self._thread:
            self._loop.call_soon(self._commit)
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed: the storage is gone
                self._loop.call_soon_threadsafe(self._commit)

    def here(self) -> bool:
        """Returns whether the caller runs on the committing thread (it may commit itself)."""
        return threading.get_ident() == self._thread

    def _commit(self) -> None:
        # Disarmed before the commit takes the pending records: a record appended after that
        # starts a group of its own, and its schedule() is not skipped.
        self._armed = False
        self._journal.commit_pending()
