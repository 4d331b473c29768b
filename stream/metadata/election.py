"""Leader elections (the retention service, the auditor): one `LeaderElection` per candidate.

The candidates' nodes are laid out as kazoo's `Lock` recipe lays them out (ephemeral sequential
`<uuid>__lock__<sequence>` children of the election path holding the candidate's identifier),
so a candidate of an older release, which used the recipe, contends in the same queue and
`Lock(path).contenders()` still names the leader. It is written on the session's calls rather
than with the recipe because the recipe blocks a thread while it waits, which a simulated
ZooKeeper on a virtual-time loop cannot serve; waiting here is an asyncio event set by a watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import KazooException, NoNodeError

from stream.errors import StreamError
from stream.logs import get_logger
from stream.metadata.connection import MetadataSession, SessionState
from stream.wakeup import wake

log = get_logger(__name__)

# kazoo's Lock recipe's node name, and its way of reading a contender's sequence number.
_NODE_NAME = "__lock__"
_CONTENDER = re.compile(r"__lock__(-?\d{10})$")
# After a failed attempt (ZooKeeper away), wait this long before contending again.
ELECTION_BACKOFF_S = 1.0


async def holds_lock(session: MetadataSession, lock: Any, path: str) -> bool:
    """Returns whether `lock` (a kazoo Lock or a `LeaderElection` under `path`) still has its
    node and the node belongs to the session's current incarnation: kazoo's `is_acquired`
    stays True after the session that held it expired, and its `acquire` contends again on a
    new session."""
    node = lock.node
    if node is None:
        return False
    try:
        stat = await asyncio.to_thread(session.retry, session.zk.exists, f"{path}/{node}")
    except StreamError as e:
        log.warning("election.leadership_unknown", path=path, error=str(e))
        return False
    return stat is not None and stat.ephemeralOwner == session.session_id


class _NodeGone(Exception):
    """Our candidate node went (its session expired): contend again with a new one."""


class LeaderElection:
    """One candidate in the election under `path` on `session` (not owned). `campaign()`
    returns once it leads; `leading` says whether it still does (thread-safe); `resign()`
    hands leadership over; `cancel()` (thread-safe) makes a pending `campaign()` return.
    Log events are `<events>.leadership_lost` and `<events>.election_failed`."""

    def __init__(
        self,
        session: MetadataSession,
        path: str,
        identifier: str,
        *,
        events: str,
        rng: random.Random | None = None,
        backoff_s: float = ELECTION_BACKOFF_S,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        """`on_change` is called (on the session's thread) when the session is lost or comes
        back: a leader looks whether it still leads."""
        self._session = session
        self.path = path
        self.identifier = identifier
        self._events = events
        self._backoff_s = backoff_s
        self._on_change = on_change
        rng = rng or random.Random()
        # kazoo finds its node after a lost reply by this prefix; so does `_enter`.
        self._prefix = uuid.UUID(int=rng.getrandbits(128), version=4).hex + _NODE_NAME
        self.node: str | None = None
        self._state_lock = threading.Lock()
        self._cancelled = False
        self._generation: int | None = None
        self._lost = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        session.add_session_listener(self._on_session)

    # ------------------------------------------------------------------ public

    @property
    def leading(self) -> bool:
        """Returns whether this candidate leads now: elected on the session's current
        incarnation, which has not been lost since."""
        with self._state_lock:
            generation, lost = self._generation, self._lost
        return (
            generation is not None and not lost and generation == self._session.session_generation
        )

    async def holds(self) -> bool:
        """Returns whether this candidate still leads, asking ZooKeeper for its node."""
        return self.leading and await holds_lock(self._session, self, self.path)

    async def campaign(self) -> bool:
        """Returns True once this candidate leads; False when cancelled, or after a failed
        attempt and a backoff (the caller calls again)."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        with self._state_lock:
            self._generation = None  # a candidate again, whatever it led before
        elected = False
        try:
            while not self._cancelled:
                try:
                    elected = await self._contend()
                    return elected
                except _NodeGone:
                    continue
        except (KazooException, StreamError) as e:
            log.warning(f"{self._events}.election_failed", error=repr(e), id=self.identifier)
            await self._resign_node()
            await self._wait(self._backoff_s)
        finally:
            if not elected:  # cancelled, failed or interrupted: leave the line
                await self._resign_node()
        return False

    async def resign(self) -> None:
        """Stops leading: deletes the candidate node (best effort; a lost session dropped it
        already) so that the next candidate leads at once."""
        with self._state_lock:
            self._generation = None
        await self._resign_node()

    @property
    def cancelled(self) -> bool:
        """Returns whether `cancel()` was called."""
        return self._cancelled

    def cancel(self) -> None:
        """Makes a pending and every later `campaign()` return False. Thread-safe."""
        self._cancelled = True
        self._wake_up()

    def close(self) -> None:
        """Stops listening to the session (the node goes with `resign()` or the session)."""
        self._session.remove_session_listener(self._on_session)

    # ------------------------------------------------------------------ inside

    async def _contend(self) -> bool:
        assert self._wake is not None
        self.node = await asyncio.to_thread(self._session.retry, self._enter)
        while not self._cancelled:
            self._wake.clear()
            generation = self._session.session_generation
            waiting = await asyncio.to_thread(self._session.retry, self._watch_predecessor)
            if waiting is None:
                with self._state_lock:
                    self._generation = generation
                    self._lost = False
                return True
            if waiting:
                await self._wake.wait()
        return False

    def _enter(self) -> str:
        """Returns our candidate node's name, creating it unless an earlier try whose reply
        was lost did."""
        zk = self._session.zk
        zk.ensure_path(self.path)
        children: list[str] = zk.get_children(self.path)  # kazoo is untyped
        for child in children:
            if child.startswith(self._prefix):
                return child
        created: str = zk.create(
            f"{self.path}/{self._prefix}",
            self.identifier.encode(),
            ephemeral=True,
            sequence=True,
        )
        return created[len(self.path) + 1 :]

    def _watch_predecessor(self) -> bool | None:
        """Returns None when our node is first in line, True when a watch is now set on the
        candidate just before it, False when that one went meanwhile (look again)."""
        node = self.node
        assert node is not None
        children = self._session.zk.get_children(self.path)
        if node not in children:
            raise _NodeGone()
        ours = _CONTENDER.search(node)
        assert ours is not None
        ahead = [
            (m.group(1), child)
            for child in children
            if (m := _CONTENDER.search(child)) is not None and m.group(1) < ours.group(1)
        ]
        if not ahead:
            return None
        predecessor = max(ahead)[1]
        watched = self._session.zk.exists(f"{self.path}/{predecessor}", watch=self._on_watch)
        return watched is not None

    async def _resign_node(self) -> None:
        node, self.node = self.node, None
        if node is None:
            return
        with contextlib.suppress(NoNodeError, KazooException, StreamError):
            await asyncio.to_thread(
                self._session.retry, self._session.zk.delete, f"{self.path}/{node}"
            )

    async def _wait(self, seconds: float) -> None:
        event = self._wake
        if event is None or self._cancelled:
            return
        event.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), seconds)

    def _on_watch(self, _event: Any) -> None:
        self._wake_up()

    def _on_session(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            with self._state_lock:
                was_leading = self._generation is not None and not self._lost
                self._lost = True
            if was_leading:
                log.warning(
                    f"{self._events}.leadership_lost", reason="session lost", id=self.identifier
                )
        self._wake_up()
        if self._on_change is not None:
            self._on_change()

    def _wake_up(self) -> None:
        wake(self._loop, self._wake)
