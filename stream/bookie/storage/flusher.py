"""The flusher: writes the frozen write cache to entry logs, then commits the entry locations,
the stream states and the journal checkpoint to the index in one transaction, and deletes the
journal files wholly before that checkpoint. Run by its thread, or step by step by a simulator
(`run_once`)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass

from stream.bookie import metrics
from stream.bookie.storage.journal import JournalPosition
from stream.bookie.storage.store import Store, failed_future
from stream.bookie.storage.write_cache import WriteCache
from stream.errors import StorageError
from stream.logs import get_logger
from stream.protocol.invariant import invariant

log = get_logger(__name__)

# (stream id, entry ids, entries serialized) of one stream in a flush, in entry id order.
_Plan = list[tuple[int, list[int], list[bytes]]]
# Entry-log bytes written between two fdatasyncs. A journal commit beside a flush waits for
# the flush's current sync; 2 MiB takes a few ms to write back.
_FLUSH_SYNC_BYTES = 2 << 20


@dataclass
class _FlushJob:
    """One flush: the frozen cache, the stream states and journal mark captured with it."""

    snapshot: WriteCache | None
    states: dict[int, bytes]
    mark: Future[JournalPosition] | None
    waiters: list[Future[None]]


def _flush_parts(plan: _Plan, snapshot: WriteCache, part_bytes: int) -> Iterator[_Plan]:
    """Yields `plan` (stream id, entry ids, entries) cut into consecutive parts of about
    `part_bytes` each, in order; the part size in entries comes from the snapshot's mean entry
    size (no per-entry work)."""
    count = sum(len(ids) for _, ids, _ in plan)
    if not count:
        return
    per_part = max(1, part_bytes * count // max(snapshot.bytes, 1))
    part: _Plan = []
    room = per_part
    for stream_id, ids, entries in plan:
        start = 0
        while start < len(ids):
            end = min(len(ids), start + room)
            part.append((stream_id, ids[start:end], entries[start:end]))
            room -= end - start
            start = end
            if room == 0:
                yield part
                part, room = [], per_part
    if part:
        yield part


def _drop_deleted(
    snapshot: WriteCache,
    streams: list[tuple[int, dict[int, bytes]]],
    plan: _Plan,
    keys: list[bytes],
    locations: list[bytes],
) -> tuple[list[bytes], list[bytes]]:
    """Returns the keys and locations of a flush without the entries that a truncate or
    trim deleted from the snapshot while it was written (call holding the index lock)."""
    changed = {
        stream_id for stream_id, cached in streams if snapshot.streams.get(stream_id) is not cached
    }
    if not changed:
        return keys, locations
    kept_keys: list[bytes] = []
    kept_locations: list[bytes] = []
    position = 0
    for stream_id, entry_ids, _ in plan:
        n = len(entry_ids)
        if stream_id in changed:
            remaining = snapshot.streams.get(stream_id) or {}
            for offset, entry_id in enumerate(entry_ids):
                if entry_id in remaining:
                    kept_keys.append(keys[position + offset])
                    kept_locations.append(locations[position + offset])
        else:
            kept_keys.extend(keys[position : position + n])
            kept_locations.extend(locations[position : position + n])
        position += n
    return kept_keys, kept_locations


class Flusher:
    """Flushes one `Store`'s write cache when asked (a full cache, `request_flush`) or at the
    jittered flush interval; counts flushes and holds the last checkpoint."""

    def __init__(self, store: Store) -> None:
        config = store.config
        self._store = store
        # The active cache's size that asks for a flush (half the cache: adds go on meanwhile).
        self.trigger_bytes = max(config.write_cache_max_bytes // 2, 1)
        # Jitter of the flush interval, seeded per bookie: the bookies of an ensemble start
        # together and would otherwise flush in step, slowing the journal commits of two of
        # them at once (an AQ = 2 ack waits for the slower of two).
        self._rng = random.Random(config.bookie_id)
        self._wakeup = threading.Event()
        self._signalled = False
        self._waiters: list[Future[None]] = []
        self._appended_at_mark = 0
        self.flushes = 0
        self.last_flush_seconds = 0.0
        self.checkpoint = JournalPosition(0, 0)

    # -- asking for a flush ---------------------------------------------------------------

    def request_flush(self) -> Future[None]:
        """Asks for a flush now; returns a future completed once everything added before
        this call is in entry logs and the index (and the checkpoint moved)."""
        unusable = self._store.usable()
        if unusable is not None:
            return failed_future(unusable)
        fut: Future[None] = Future()
        fut.set_running_or_notify_cancel()
        with self._store.lock:
            self._waiters.append(fut)
        self.want_flush()
        return fut

    def cache_full(self) -> None:
        """Asks for a flush once per flush: the active cache reached `trigger_bytes`."""
        if not self._signalled:
            self._signalled = True
            self.want_flush()

    def want_flush(self) -> None:
        self._wakeup.set()
        self._store.note_work()

    def flush_wanted(self) -> bool:
        """Returns whether a flush was asked for since the last one."""
        return self._wakeup.is_set()

    def next_delay_s(self) -> float:
        """Returns how long the flusher waits for a wake-up before a timed flush (the
        interval, jittered per bookie)."""
        interval_s = self._store.config.flush_interval_ms / 1000.0
        return interval_s * self._rng.uniform(0.75, 1.25)

    def fail_waiters(self, error: BaseException) -> None:
        """Fails the futures of the flushes asked for and not done (the storage is dropped)."""
        with self._store.lock:
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.set_exception(error)

    # -- flushing -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """The flusher thread's loop, until `stop` is set (then `interrupt()` wakes it)."""
        while not stop.is_set():
            self._wakeup.wait(self.next_delay_s())
            if stop.is_set():
                break
            try:
                self.run_once()
            except Exception:
                log.exception("storage.flusher_failed")
                return
        # Flush waiters left at stop are served by close()'s final flush (or failed by
        # abandon()).

    def interrupt(self) -> None:
        """Wakes the flusher thread (to see its stop event)."""
        self._wakeup.set()

    def run_once(self) -> None:
        """Flushes the write cache now: the flusher's step. Raises what the flush raised
        (the storage is then failed)."""
        self._wakeup.clear()
        with self._store.lock:
            job = self._swap()
        self._flush(job)

    def flush_all(self, checkpoint: JournalPosition | None = None) -> None:
        """Flushes the write cache and the stream states now, even when nothing changed (a
        clean close, replay); with `checkpoint`, the one to commit (else the journal's
        end)."""
        with self._store.lock:
            job = self._swap(force=True)
        self._flush(job, checkpoint)

    def _swap(self, *, force: bool = False) -> _FlushJob:
        """Returns the next flush job: freezes the active cache into the snapshot and
        captures the dirty stream states and a journal mark, atomically (call holding the
        store's lock). The job has no snapshot when there is nothing to flush."""
        store = self._store
        waiters, self._waiters = self._waiters, []
        active = store.active
        journal_moved = store.journal.appended_records != self._appended_at_mark
        if not active.streams and not store.dirty and not journal_moved and not force:
            return _FlushJob(None, {}, None, waiters)
        invariant(store.snapshot is None, "one flush at a time")
        active.frozen = True
        store.snapshot = active
        store.snapshot_bytes = active.bytes
        store.active = WriteCache()
        states = {stream_id: store.states[stream_id].pack() for stream_id in store.dirty}
        store.dirty = set()
        mark = store.journal.mark() if store.opened else None
        self._appended_at_mark = store.journal.appended_records
        self._signalled = False
        return _FlushJob(active, states, mark, waiters)

    def _flush(self, job: _FlushJob, checkpoint: JournalPosition | None = None) -> None:
        """Writes a flush job: entry logs (synced), then one LMDB transaction with the
        locations, the states and the checkpoint (synced), then deletes the journal files
        before the checkpoint and completes the job's waiters."""
        store = self._store
        snapshot = job.snapshot
        if snapshot is None:
            for waiter in job.waiters:
                waiter.set_result(None)
            return
        logs = store.logs
        started = store.clock()
        try:
            # A C-level copy: the event loop may replace a stream's dict meanwhile.
            streams = sorted(snapshot.streams.items())
            plan: _Plan = []
            for stream_id, cached in streams:
                if cached:
                    entry_ids = sorted(cached)
                    plan.append((stream_id, entry_ids, list(map(cached.__getitem__, entry_ids))))
            with logs.lock:
                logs.begin_flush()
                keys: list[bytes] = []
                locations: list[bytes] = []
                written = 0
                # Synced part by part: a journal fdatasync that runs beside an entry-log
                # fdatasync waits for that one's writeback (one ext4 transaction), so every
                # sync here is kept short.
                for part in _flush_parts(plan, snapshot, _FLUSH_SYNC_BYTES):
                    part_keys, part_locations, part_written = logs.write_entries(part)
                    keys += part_keys
                    locations += part_locations
                    written += part_written
                    logs.sync()
            if checkpoint is None and job.mark is not None:
                if not job.mark.done() and store.commits_journal_here():
                    # No journal thread, and this thread commits: the flush commits the
                    # mark's group itself (else the journal's committer does).
                    store.journal.commit_pending()
                checkpoint = job.mark.result()
            with store.index_lock:
                keys, locations = _drop_deleted(snapshot, streams, plan, keys, locations)
                store.index.commit_flush(keys, locations, job.states, checkpoint)
                logs.end_flush()
            store.index.sync()
        except BaseException as e:
            logs.end_flush()
            store.fail(e)
            for waiter in job.waiters:
                waiter.set_exception(StorageError(f"flush failed: {e!r}"))
            raise
        store.snapshot = None
        store.snapshot_bytes = 0
        if checkpoint is not None:
            self.checkpoint = checkpoint
            store.journal.delete_before(checkpoint.seq)
        elapsed = store.clock() - started
        self.flushes += 1
        self.last_flush_seconds = elapsed
        metrics.FLUSH_SECONDS.observe(elapsed)
        log.debug("storage.flushed", entries=len(keys), bytes=written, seconds=round(elapsed, 4))
        for waiter in job.waiters:
            waiter.set_result(None)
