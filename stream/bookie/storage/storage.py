"""StreamStorage: the bookie's local storage engine (BookKeeper's DbLedgerStorage in Python).

Adds go to the journal (group commit) and to the write cache; a flusher thread writes the
cache to entry logs, commits the entry locations, the stream states and the journal checkpoint
to LMDB in one transaction, and deletes the journal files wholly before that checkpoint. A GC
thread deletes entry logs without live entries and compacts sparse ones.

The jobs live in their own modules over one shared `Store`: the term rule and the state
requests (`rules`), the add path (`adds`), the read path (`reads`), the flusher (`flusher`),
journal replay (`journal_replay`) and the GC rounds (`gc_schedule`). This class wires them,
runs the threads and answers for the whole.

Threads. Every public method is called from ONE thread (the server's event loop). Background
threads: the journal writer, the flusher and GC/compaction. The store's `lock` makes each
public mutation atomic with respect to the flusher's snapshot swap (which also captures the
stream states and the journal mark that make up one checkpoint); its `index_lock` serialises
LMDB write transactions (flush commits, truncations, GC and compaction), so that a truncation
that happens during a flush wins over the flush's index commit.

Durability is returned as `concurrent.futures.Future` objects completed by the journal thread
after the fdatasync that covers the request's records (None when nothing needs waiting). All
requests of one group commit share one future (already marked running, so it cannot be
cancelled by one of its waiters); a later request's future completes after an earlier one's.
`gc_once()`, `compact_once()` and `close()` block: call the first two from a worker thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from stream.bookie import metrics
from stream.bookie.config import BookieConfig
from stream.bookie.storage.adds import AddPath
from stream.bookie.storage.disk_port import OS_DISK, DiskPort
from stream.bookie.storage.flusher import Flusher
from stream.bookie.storage.gc import CompactionReport, GcReport
from stream.bookie.storage.gc_schedule import GcSchedule
from stream.bookie.storage.journal_replay import replay_journal
from stream.bookie.storage.loop_commits import LoopCommits
from stream.bookie.storage.outcomes import (
    AddOutcome,
    FenceResult,
    ReadResult,
    ReplayReport,
    TrimOutcome,
    TruncateOutcome,
)
from stream.bookie.storage.reads import ReadPath
from stream.bookie.storage.rules import RequestRules
from stream.bookie.storage.scanned import AddRequest
from stream.bookie.storage.state import LocalStreamState, StreamStateView
from stream.bookie.storage.store import Store
from stream.bookie.unsafe import SAFE, UnsafeSkips
from stream.errors import StorageError
from stream.framing.range_answer import FramedEntries
from stream.logs import get_logger
from stream.protocol.invariant import invariant
from stream.wire import bookie_pb2 as pb

log = get_logger(__name__)

# How often stopping threads commits the journal for a flush that waits on it (LoopCommits).
_JOIN_POLL_S = 0.005


class StreamStorage:
    """A bookie's storage of many streams in `config`'s journal, ledger and index
    directories. `open()` before use, `close()` for a clean shutdown."""

    def __init__(
        self,
        config: BookieConfig,
        *,
        disk: DiskPort = OS_DISK,
        clock: Callable[[], float] = time.monotonic,
        threads: bool = True,
        journal_loop: asyncio.AbstractEventLoop | None = None,
        unsafe: UnsafeSkips = SAFE,
    ) -> None:
        """`disk` is where the files and the index live, `clock` the monotonic clock in
        seconds. Without `threads`, no thread is started: the caller (the simulator) runs the
        background jobs, `commit_journal()`, `run_flush_once()` and `run_gc_due()`, when
        `on_work` tells it. With `threads` and a `journal_loop` (the running loop of the
        thread that opens the storage and makes its requests), that loop commits the
        journal's groups instead of a journal thread (`LoopCommits`). `unsafe` turns
        protections off, in tests only (`stream.bookie.unsafe`)."""
        self.config = config
        self.unclean_shutdown_detected = False
        store = self._store = Store(
            config,
            disk=disk,
            clock=clock,
            threaded=threads,
            ack_before_sync="journal_sync" in unsafe,
            wait_unsynced_terms="unsynced_term" not in unsafe,
        )
        self._rules = RequestRules(store, unsafe)
        self._flusher = Flusher(store)
        self._adds = AddPath(store, self._rules, self._flusher, unsafe)
        self._reads = ReadPath(store, self._rules, unsafe)
        self._gc = GcSchedule(store)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._journal_loop = journal_loop if threads else None

    @property
    def on_work(self) -> Callable[[], None] | None:
        """Without threads: called when a job has work (a journal group pending, a flush
        asked for), so that the caller schedules it."""
        return self._store.on_work

    @on_work.setter
    def on_work(self, hook: Callable[[], None] | None) -> None:
        self._store.on_work = hook

    @property
    def on_lac_advanced(self) -> Callable[[int, int], None] | None:
        """Called (stream_id, new_lac) on the event-loop thread when a stream's LAC rises."""
        return self._adds.on_lac_advanced

    @on_lac_advanced.setter
    def on_lac_advanced(self, hook: Callable[[int, int], None] | None) -> None:
        self._adds.on_lac_advanced = hook

    # -- lifecycle ------------------------------------------------------------------------

    def open(self) -> ReplayReport:
        """Opens the directories, sets the unclean-shutdown bit, replays the journal from the
        checkpoint (entries back into the write cache; term/truncate/trim/limbo applied in
        order) and starts the journal, flusher and GC threads. Returns what replay found;
        raises `StorageError` when the storage is corrupt or unusable."""
        store = self._store
        invariant(not store.opened, "StreamStorage.open() is called once")
        config = self.config
        try:
            for path in (config.journal_path, config.ledger_path, config.index_path):
                store.disk.mkdir(path)
        except OSError as e:
            raise StorageError(f"cannot create storage directories: {e}") from e
        store.index.open()
        self.unclean_shutdown_detected = store.index.unclean_bit()
        store.index.set_unclean_bit(True)
        store.states = {
            stream_id: LocalStreamState.unpack(raw)
            for stream_id, raw in store.index.load_states().items()
        }
        store.limbo_count = sum(1 for s in store.states.values() if s.limbo)
        metrics.LIMBO_STREAMS.set(store.limbo_count)
        store.logs.open()
        checkpoint = self._flusher.checkpoint = store.index.checkpoint()
        report = replay_journal(store, self._flusher, checkpoint, self.unclean_shutdown_detected)
        if self._journal_loop is not None:
            store.loop_commits = LoopCommits(store.journal, self._journal_loop)
            store.journal.on_group = store.loop_commits.schedule
        store.journal.start(thread=store.threaded and store.loop_commits is None)
        store.opened = True
        self._gc.start()
        if store.threaded:
            self._start_thread("flusher", self._flusher.run)
            self._start_thread("gc", self._gc.run)
        log.info(
            "storage.opened",
            streams=len(store.states),
            unclean=report.unclean,
            records_replayed=report.records_replayed,
            entries_replayed=report.entries_replayed,
        )
        return report

    def close(self) -> None:
        """Shuts down cleanly: a final flush, a checkpoint at the end of the journal, then
        the unclean-shutdown bit cleared last. A restart after this replays nothing."""
        store = self._store
        if not store.opened or store.closed:
            return
        store.closed = True
        self._stop_threads()
        if store.failure is None:
            try:
                self._flusher.flush_all()
            except Exception:  # keep shutting down; the unclean bit stays set
                log.exception("storage.final_flush_failed")
        store.journal.stop(drain=True)
        store.logs.close()
        if store.failure is None:
            store.index.set_unclean_bit(False)
        store.index.close()
        log.info("storage.closed", clean=store.failure is None)

    def abandon(self) -> None:
        """Stops every thread without flushing and closes the files as a kill -9 would
        leave them (what was written stays in the OS page cache; pending journal records are
        dropped and their futures fail). For crash tests: reopen with a new StreamStorage."""
        store = self._store
        if not store.opened or store.closed:
            return
        store.closed = True
        self._stop_threads()
        self._flusher.fail_waiters(StorageError("storage abandoned before the flush"))
        store.journal.stop(drain=False)
        store.logs.abandon()
        store.index.close()

    def _start_thread(self, name: str, target: Callable[[threading.Event], None]) -> None:
        thread = threading.Thread(
            target=target, args=(self._stop,), name=f"storage-{name}", daemon=True
        )
        thread.start()
        self._threads.append(thread)

    def _stop_threads(self) -> None:
        self._stop.set()
        self._flusher.interrupt()
        self._gc.stop()
        for thread in self._threads:
            thread.join(_JOIN_POLL_S)
            while thread.is_alive():
                # A flush on its thread may be waiting for its checkpoint's mark, which only
                # the loop commits (LoopCommits), and this may be the loop's thread.
                if self._store.commits_journal_here():
                    self._store.journal.commit_pending()
                thread.join(_JOIN_POLL_S)
        self._threads = []

    # -- requests (see the jobs' modules) -------------------------------------------------

    def add_batch(self, request: AddRequest, raw: bytes | None = None) -> AddOutcome:
        """Stores one batch of adds for one stream (`AddPath.add_batch`)."""
        return self._adds.add_batch(request, raw)

    def store_copies(self, stream_id: int, entries: list[pb.Entry]) -> int:
        """Stores entries a repair copied from peers (`AddPath.store_copies`)."""
        return self._adds.store_copies(stream_id, entries)

    def fence(self, stream_id: int, term: int) -> FenceResult:
        """Applies the term rule; returns what the bookie knows (`RequestRules.fence`)."""
        return self._rules.fence(stream_id, term)

    def truncate(self, stream_id: int, term: int, after_entry_id: int) -> TruncateOutcome:
        """Deletes the entries above `after_entry_id`, durably (`RequestRules.truncate`)."""
        return self._rules.truncate(stream_id, term, after_entry_id)

    def trim(self, stream_id: int, before_entry_id: int) -> TrimOutcome:
        """Drops the entries below `before_entry_id` (`RequestRules.trim`)."""
        return self._rules.trim(stream_id, before_entry_id)

    def record_term(self, stream_id: int, term: int) -> Future[None]:
        """Raises the stream's term to at least `term` (`RequestRules.record_term`)."""
        return self._rules.record_term(stream_id, term)

    def set_limbo(self, stream_id: int, limbo: bool, term: int | None = None) -> Future[None]:
        """Sets or clears the stream's limbo status (`RequestRules.set_limbo`)."""
        return self._rules.set_limbo(stream_id, limbo, term)

    def read(self, stream_id: int, entry_id: int, term: int = 0) -> ReadResult:
        """Returns one entry (`ReadPath.read`)."""
        return self._reads.read(stream_id, entry_id, term)

    def read_range(
        self, stream_id: int, first: int, last: int, max_batch_bytes: int = 0, *, raw: bool = False
    ) -> Iterator[tuple[pb.Code, list[Any] | FramedEntries]]:
        """Yields (code, entries) batches of [first, last] (`ReadPath.read_range`)."""
        return self._reads.read_range(stream_id, first, last, max_batch_bytes, raw=raw)

    def missing_entry_ids(self, stream_id: int, entry_ids: list[int]) -> list[int]:
        """Returns those of `entry_ids` the bookie lacks (`ReadPath.missing_entry_ids`)."""
        return self._reads.missing_entry_ids(stream_id, entry_ids)

    # -- stream states --------------------------------------------------------------------

    def lac(self, stream_id: int) -> tuple[int, int] | None:
        """Returns the stream's (lac, lafr), or None for an unknown stream."""
        state = self._store.states.get(stream_id)
        return (state.lac, state.lafr) if state is not None else None

    def stream_state(self, stream_id: int) -> StreamStateView | None:
        """Returns an immutable view of the stream's state, or None when unknown."""
        state = self._store.states.get(stream_id)
        return state.view() if state is not None else None

    def term(self, stream_id: int) -> int:
        """Returns the stream's term (0: unknown; cheap: no view is built)."""
        state = self._store.states.get(stream_id)
        return state.term if state is not None else 0

    def knows(self, stream_id: int) -> bool:
        """Returns whether the bookie holds state for the stream (cheap: no view is built)."""
        return stream_id in self._store.states

    def stream_ids(self) -> list[int]:
        """Returns the ids of every stream this bookie knows."""
        return list(self._store.states)

    # -- the background jobs, one step each (run by the threads, or by a simulator) -------

    def commit_journal(self) -> bool:
        """Commits the pending journal records (one write, one fdatasync); returns whether
        there were any. The journal thread's step, for a storage opened without threads."""
        return self._store.journal.commit_pending()

    def request_flush(self) -> Future[None]:
        """Asks the flusher for a flush now; returns a future completed once everything added
        before this call is in entry logs and the index (and the checkpoint moved)."""
        return self._flusher.request_flush()

    def write_journal(self) -> bool:
        """Writes the pending journal records without syncing them: the first half of
        `commit_journal`, for a caller that gives the fdatasync virtual time (the simulator);
        `sync_journal()` is the second. Returns whether any were pending."""
        return self._store.journal.write_pending()

    def sync_journal(self) -> bool:
        """Syncs what `write_journal` wrote and acknowledges it; returns whether it wrote."""
        return self._store.journal.sync_written()

    def flush_wanted(self) -> bool:
        """Returns whether a flush was asked for (a full write cache or `request_flush`)
        since the last one."""
        return self._flusher.flush_wanted()

    def next_flush_delay_s(self) -> float:
        """Returns how long the flusher waits for a wake-up before a timed flush (the
        interval, jittered per bookie)."""
        return self._flusher.next_delay_s()

    def run_flush_once(self) -> None:
        """Flushes the write cache now (entry logs, index, checkpoint): the flusher's step.
        Raises what the flush raised (the storage is then failed)."""
        self._flusher.run_once()

    def gc_once(self) -> GcReport:
        """Runs one garbage collection now (`GcSchedule.gc_once`)."""
        return self._gc.gc_once()

    def compact_once(self, threshold: float, kind: str = "manual") -> CompactionReport:
        """Runs one compaction now (`GcSchedule.compact_once`)."""
        return self._gc.compact_once(threshold, kind)

    def next_gc_due(self) -> float:
        """Returns the clock time of the next GC or compaction round."""
        return self._gc.next_due()

    def run_gc_due(self) -> None:
        """Runs the GC and compaction rounds that are due by the clock: the GC thread's
        step. Blocks for the round's length."""
        self._gc.run_due()

    # -- stats ----------------------------------------------------------------------------

    def stats(self) -> dict[str, object]:
        """Returns counters and sizes for Info, logs and tests."""
        store = self._store
        flusher = self._flusher
        index_open = store.opened and not store.closed
        return {
            "streams": len(store.states),
            "limbo_streams": store.limbo_count,
            "write_cache_bytes": store.active.bytes + store.snapshot_bytes,
            "entry_logs": len(store.logs.log_ids()),
            "entry_log_bytes": store.logs.disk_bytes(),
            "journal_bytes": store.journal.disk_bytes(),
            "journal_bytes_written": store.journal.bytes_written,
            "entry_log_bytes_written": store.logs.bytes_written,
            "index_entries": store.index.entry_count() if index_open else 0,
            "index_bytes": store.index.disk_bytes(),
            "too_busy_batches": self._adds.too_busy_batches,
            "flushes": flusher.flushes,
            "last_flush_seconds": flusher.last_flush_seconds,
            "checkpoint": tuple(flusher.checkpoint),
            "unclean_shutdown_detected": self.unclean_shutdown_detected,
            "failed": store.failure is not None,
        }
