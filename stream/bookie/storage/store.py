"""What the storage engine's jobs share: the stream states, the two write caches, the journal,
entry logs and index with their locks, and whether the storage can serve; with the lookups and
the state changes that both requests and journal replay make.

Threads (see `stream.bookie.storage.storage`): the state changes run on the event-loop thread
(or replay) holding `lock`, which makes them atomic with respect to the flusher's snapshot swap;
`index_lock` serialises LMDB write transactions, so that a truncation that happens during a
flush wins over the flush's index commit.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from stream.bookie import metrics
from stream.bookie.config import BookieConfig
from stream.bookie.storage.disk_port import DiskPort
from stream.bookie.storage.entry_log import EntryLogGone, EntryLogs
from stream.bookie.storage.index import Index
from stream.bookie.storage.journal import Journal
from stream.bookie.storage.loop_commits import LoopCommits
from stream.bookie.storage.state import LocalStreamState
from stream.bookie.storage.write_cache import WriteCache
from stream.errors import StorageError
from stream.logs import get_logger
from stream.wire import bookie_pb2 as pb

log = get_logger(__name__)

# The write cache holds entries serialized (`stream.bookie.storage.write_cache`).
_parse = pb.Entry.FromString
_MAX_ENTRY_ID = (1 << 63) - 1


def _cache_bytes(store: weakref.ref[Store]) -> float:
    """Returns the bytes in `store`'s write caches (0 once it is gone)."""
    live = store()
    return live.active.bytes + live.snapshot_bytes if live is not None else 0


def failed_future(message: str, **context: object) -> Future[None]:
    """Returns a future already failed with `StorageError(message, **context)`."""
    fut: Future[None] = Future()
    fut.set_running_or_notify_cancel()
    fut.set_exception(StorageError(message, **context))
    return fut


class Store:
    """The storage's shared state (attributes read and replaced by every job) and the state
    changes on it. `on_work`, without threads, is called when a background job has work (a
    journal group pending, a flush asked for), so that the caller schedules it."""

    def __init__(
        self,
        config: BookieConfig,
        *,
        disk: DiskPort,
        clock: Callable[[], float],
        threaded: bool,
        ack_before_sync: bool = False,
        wait_unsynced_terms: bool = True,
    ) -> None:
        """`ack_before_sync` (tests only: the `journal_sync` switch of `stream.bookie.unsafe`)
        acknowledges journal groups once written, before their fdatasync;
        `wait_unsynced_terms` off (tests only: the `unsynced_term` switch) answers a request
        of a stream's new term before that term's journal record is synced."""
        self.config = config
        self.disk = disk
        self.clock = clock
        self.threaded = threaded
        self.on_work: Callable[[], None] | None = None
        # With threads: the event loop that commits the journal's groups, None with a
        # journal thread (set by StreamStorage.open).
        self.loop_commits: LoopCommits | None = None
        self.journal = Journal(
            config.journal_path,
            max_file_bytes=config.journal_max_file_bytes,
            max_group_wait_ms=config.journal_max_group_wait_ms,
            disk=disk,
            clock=clock,
            on_group=self.note_work,
            ack_before_sync=ack_before_sync,
        )
        self.logs = EntryLogs(
            config.ledger_path, size_limit_bytes=config.entry_log_size_limit_bytes, disk=disk
        )
        self.index = Index(config.index_path, disk=disk)
        self.index_lock = threading.Lock()
        self.lock = threading.Lock()
        self.states: dict[int, LocalStreamState] = {}
        # Streams whose state changed since the last flush's snapshot.
        self.dirty: set[int] = set()
        self.limbo_count = 0
        self.active = WriteCache()
        self.snapshot: WriteCache | None = None
        self.snapshot_bytes = 0
        # Read when scraped instead of set on every Add batch (a Gauge.set takes a lock);
        # the newest store of the process is the one shown.
        metrics.WRITE_CACHE_BYTES.set_function(functools.partial(_cache_bytes, weakref.ref(self)))
        self.opened = False
        self.closed = False
        self.failure: BaseException | None = None
        # Per stream: the journal record that raised its term last, until it is synced.
        self._unsynced_terms: dict[int, Future[None]] = {}
        self._wait_unsynced_terms = wait_unsynced_terms

    def term_recorded(self, stream_id: int, durable: Future[None] | None) -> None:
        """Notes `durable`, the sync of a journal record raising the stream's term (call
        holding `lock`)."""
        if durable is not None and not durable.done():
            self._unsynced_terms[stream_id] = durable

    def unsynced_term(self, stream_id: int) -> Future[None] | None:
        """Returns the sync a request of the stream's current term waits for before its
        answer, None when that term is durable (call holding `lock`). The term raised in
        memory at once: a second request of the new term, served while the first waits for
        the journal, must not answer with a term a crash could take back (docs/design.md §4,
        "a bookie never answers with a term it may have forgotten")."""
        pending = self._unsynced_terms.get(stream_id)
        if pending is not None and pending.done():
            del self._unsynced_terms[stream_id]
            return None
        return pending if self._wait_unsynced_terms else None

    def commits_journal_here(self) -> bool:
        """Returns whether the calling thread commits the journal's groups itself (no journal
        thread: the simulator's, or the event loop's with `loop_commits`)."""
        if not self.threaded:
            return True
        return self.loop_commits is not None and self.loop_commits.here()

    def note_work(self) -> None:
        """Tells the caller that a background job has work (without threads)."""
        if self.on_work is not None:
            self.on_work()

    def usable(self) -> str | None:
        """Returns why requests cannot be served now, or None."""
        if not self.opened or self.closed:
            return "storage is not open"
        if self.failure is not None:
            return f"storage failed: {self.failure!r}"
        if self.journal.failure is not None:
            return f"journal failed: {self.journal.failure!r}"
        return None

    def fail(self, error: BaseException) -> None:
        """Marks the storage failed: every request is refused from now on."""
        if self.failure is None:
            self.failure = error
            log.error("storage.failed", error=repr(error))

    # -- state changes shared by requests and replay (call holding `lock`) ----------------

    def state_for(self, stream_id: int) -> LocalStreamState:
        """Returns the stream's state, created when missing."""
        state = self.states.get(stream_id)
        if state is None:
            state = self.states[stream_id] = LocalStreamState()
        return state

    def apply_term(self, stream_id: int, term: int) -> LocalStreamState:
        state = self.state_for(stream_id)
        if term > state.term:
            state.term = term
        self.dirty.add(stream_id)
        return state

    def apply_truncate(self, stream_id: int, term: int, after_entry_id: int) -> LocalStreamState:
        state = self.apply_term(stream_id, term)
        self.delete_above(stream_id, state, after_entry_id)
        state.truncate_term = term
        state.truncate_after = after_entry_id
        return state

    def apply_trim(self, stream_id: int, before_entry_id: int) -> None:
        state = self.state_for(stream_id)
        if before_entry_id <= state.first_entry_id:
            return
        state.first_entry_id = before_entry_id
        self.active.drop_below(stream_id, before_entry_id)
        snapshot = self.snapshot
        if snapshot is not None:
            # Under the index lock so that the flusher's commit sees either the old
            # snapshot dict or the filtered one, never a half state.
            with self.index_lock:
                snapshot.drop_below(stream_id, before_entry_id)
        self.dirty.add(stream_id)

    def apply_limbo(self, stream_id: int, limbo: bool, term: int) -> None:
        state = self.state_for(stream_id)
        if term > state.term:
            state.term = term
        if state.limbo != limbo:
            state.limbo = limbo
            self.limbo_count += 1 if limbo else -1
            metrics.LIMBO_STREAMS.set(self.limbo_count)
        self.dirty.add(stream_id)

    def delete_above(self, stream_id: int, state: LocalStreamState, after_entry_id: int) -> None:
        """Deletes the stream's entries above `after_entry_id` from the active cache, the
        snapshot and the index, and lowers last_entry_id to what remains."""
        self.active.drop_above(stream_id, after_entry_id)
        snapshot = self.snapshot
        with self.index_lock:
            if snapshot is not None:
                snapshot.drop_above(stream_id, after_entry_id)
            self.index.delete_range(stream_id, after_entry_id + 1, _MAX_ENTRY_ID)
        if state.last_entry_id > after_entry_id:
            held = [
                self.active.max_entry_id(stream_id, after_entry_id),
                self.index.max_entry_id(stream_id, after_entry_id),
            ]
            if snapshot is not None:
                held.append(snapshot.max_entry_id(stream_id, after_entry_id))
            state.last_entry_id = max(held)
        self.dirty.add(stream_id)

    def put_entries(
        self,
        stream_id: int,
        state: LocalStreamState,
        ids: list[int],
        datas: list[bytes],
        truncate_at: Sequence[int] = (),
    ) -> None:
        """Puts entries (`datas`: each serialized, as the cache holds them) into the active
        cache in order; the entry at each position of `truncate_at` (flag TRUNCATE) deletes
        every higher entry (cache, snapshot, index) before the entries after it are stored."""
        cached = self.active.streams.get(stream_id)
        if cached is None:
            cached = self.active.streams[stream_id] = {}
        if not truncate_at:
            # One C-level update for the batch: no per-entry Python.
            cached.update(zip(ids, datas, strict=True))
            top = max(ids)
            if top > state.last_entry_id:
                state.last_entry_id = top
            return
        start = 0
        for position in truncate_at:
            cached.update(zip(ids[start : position + 1], datas[start : position + 1], strict=True))
            state.last_entry_id = max(state.last_entry_id, ids[position])
            self.delete_above(stream_id, state, ids[position])
            start = position + 1
        if start < len(ids):
            cached.update(zip(ids[start:], datas[start:], strict=True))
            state.last_entry_id = max(state.last_entry_id, max(ids[start:]))

    # -- lookups --------------------------------------------------------------------------

    def cached(self, stream_id: int) -> tuple[dict[int, bytes], dict[int, bytes]]:
        """Returns the stream's entries (serialized) in the active cache and in the snapshot
        (empty dicts when none), in the order lookups go: active, snapshot, then the index."""
        active = self.active.streams.get(stream_id) or {}
        snapshot = self.snapshot
        snap = (snapshot.streams.get(stream_id) if snapshot is not None else None) or {}
        return active, snap

    def lookup(self, stream_id: int, entry_id: int) -> pb.Entry | None:
        """Returns the entry held (None: not held); raises `StorageError` when its entry log
        keeps vanishing under the read."""
        # Order matters: active cache, then snapshot, then index. The flusher swaps
        # active -> snapshot and drops the snapshot only after the index commit, so an entry
        # is always in one of the places looked at later.
        cached = self.active.streams.get(stream_id)
        if cached is not None:
            data = cached.get(entry_id)
            if data is not None:
                return _parse(data)
        snapshot = self.snapshot
        if snapshot is not None:
            cached = snapshot.streams.get(stream_id)
            if cached is not None:
                data = cached.get(entry_id)
                if data is not None:
                    return _parse(data)
        for _ in range(3):
            location = self.index.get(stream_id, entry_id)
            if location is None:
                return None
            try:
                return self.logs.read_entry(location)
            except EntryLogGone:
                continue  # compaction moved it and deleted the old log: look again
        raise StorageError("entry log vanished under a read", stream_id=stream_id)
