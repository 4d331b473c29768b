"""StreamStorage: the bookie's local storage engine (BookKeeper's DbLedgerStorage in Python).

Adds go to the journal (group commit) and to the write cache; a flusher thread writes the
cache to entry logs, commits the entry locations, the stream states and the journal checkpoint
to LMDB in one transaction, and deletes the journal files wholly before that checkpoint. A GC
thread deletes entry logs without live entries and compacts sparse ones.

Threads. Every public method is called from ONE thread (the server's event loop). Background
threads: the journal writer, the flusher and GC/compaction. `_lock` makes each public
mutation atomic with respect to the flusher's snapshot swap (which also captures the stream
states and the journal mark that make up one checkpoint); `_index_lock` serialises LMDB write
transactions (flush commits, truncations, GC and compaction), so that a truncation that happens
during a flush wins over the flush's index commit.

Durability is returned as `concurrent.futures.Future` objects completed by the journal thread
after the fdatasync that covers the request's records (None when nothing needs waiting). All
requests of one group commit share one future (already marked running, so it cannot be
cancelled by one of its waiters); a later request's future completes after an earlier one's.
`gc_once()`, `compact_once()` and `close()` block: call the first two from a worker thread.
"""

from __future__ import annotations

import random
import struct
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate, repeat
from operator import add, eq, sub
from typing import Any

import crc32c
import structlog

from stream.bookie import metrics
from stream.bookie.config import BookieConfig
from stream.bookie.storage import codec
from stream.bookie.storage.disk_port import OS_DISK, DiskPort
from stream.bookie.storage.entry_log import EntryLogGone, EntryLogs
from stream.bookie.storage.gc import CompactionReport, GarbageCollector, GcReport
from stream.bookie.storage.index import Index
from stream.bookie.storage.journal import Journal, JournalPosition, replay
from stream.bookie.storage.state import LocalStreamState, StreamStateView
from stream.bookie.storage.write_cache import WriteCache
from stream.bookie.unsafe import SAFE, UnsafeSkips
from stream.errors import StorageError
from stream.framing.verify import checksum_ok
from stream.protocol.checksum import ENTRY_HEADER
from stream.protocol.codes import limbo_code
from stream.protocol.invariant import invariant
from stream.protocol.justified import overwrite_refusal
from stream.protocol.terms import TermDecision, term_decision
from stream.protocol.truncation import (
    TruncateDecision,
    stale_truncate_message,
    truncate_decision,
)
from stream.wire import bookie_pb2 as pb

log = structlog.get_logger(__name__)

Entry = pb.Entry
OK = pb.OK
NO_SUCH_ENTRY = pb.NO_SUCH_ENTRY
NO_SUCH_STREAM = pb.NO_SUCH_STREAM
INVALID_TERM = pb.INVALID_TERM
TRIMMED = pb.TRIMMED
TOO_BUSY = pb.TOO_BUSY
BAD_REQUEST = pb.BAD_REQUEST
INTERNAL = pb.INTERNAL
FLAG_TRUNCATE = pb.TRUNCATE
# Entries with these flags are classified one by one, off the hot loop: a TRUNCATE takes
# effect, and an entry's ATTRIBUTES extend its checksum.
_FLAGS_TO_CLASSIFY = pb.TRUNCATE | pb.ATTRIBUTES

_ACCEPT_NEW = TermDecision.ACCEPT_NEW
_MAX_ENTRY_ID = (1 << 63) - 1
# Hot path: the entry checksum of stream/protocol/checksum.py (`entry_checksum`) inlined with
# its own precompiled header struct, because a function call per entry shows in profiles.
# tests/unit/bookie/test_storage_add.py checks that both agree.
_pack_entry_header = ENTRY_HEADER.pack
_crc32c = crc32c.crc32c
# Write cache: memory counted per entry beyond its payload (wrapper object, dict slot, arena).
_CACHE_ENTRY_OVERHEAD_BYTES = 128
# Read-range: bytes counted per entry beyond its payload (envelope estimate).
_ENTRY_OVERHEAD_BYTES = 32
_serialize_entry = Entry.SerializeToString
# Read-range: index locations fetched per LMDB transaction.
_RANGE_PREFETCH = 4096
# Flush: entry-log bytes written between two fdatasyncs. A journal commit beside a flush waits
# for the flush's current sync; 2 MiB takes a few ms to write back.
_FLUSH_SYNC_BYTES = 2 << 20


@dataclass(frozen=True, slots=True)
class Locations:
    """Index locations of consecutive entries, as columns (three tuples of ints, not a tuple
    per entry: a range read makes thousands of them per answer, and ints are no work for the
    cyclic GC)."""

    logs: tuple[int, ...]
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.logs)

    def cut(self, n: int) -> Locations:
        return Locations(self.logs[:n], self.offsets[:n], self.lengths[:n])


@lru_cache(maxsize=64)
def _locations_struct(n: int) -> struct.Struct:
    return struct.Struct("<" + codec.LOCATION.format.lstrip("<") * n)


def _parse_locations(located: list[bytes]) -> Locations:
    flat = _locations_struct(len(located)).unpack(b"".join(located))
    return Locations(flat[0::3], flat[1::3], flat[2::3])


# -- outcomes -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AddOutcome:
    """The result of `add_batch`: one code per entry (same order; one code when the batch
    was empty), the bookie's term for the stream afterwards, the future to wait for before
    answering (None: nothing to wait for; batches of one group commit share the same future
    object), a message for non-OK codes, and the entry ids of the batch (so the caller need
    not walk the entries again)."""

    codes: list[int]
    bookie_term: int
    durable: Future[None] | None
    message: str = ""
    entry_ids: list[int] = field(default_factory=list)
    # Why an entry of the batch was refused for replacing an acknowledged one ("": none).
    refused_overwrite: str = ""


@dataclass(frozen=True, slots=True)
class FenceResult:
    """The result of `fence`: what the bookie knows of the stream's end."""

    code: int
    bookie_term: int
    lac: int
    lafr: int
    last_entry_id: int
    limbo: bool
    durable: Future[None] | None
    message: str = ""


@dataclass(frozen=True, slots=True)
class ReadResult:
    """The result of `read`: the entry when `code` is OK."""

    code: int
    entry: Entry | None
    lac: int
    bookie_term: int
    first_entry_id: int
    durable: Future[None] | None
    message: str = ""


@dataclass(frozen=True, slots=True)
class TruncateOutcome:
    """The result of `truncate`."""

    code: int
    bookie_term: int
    durable: Future[None] | None
    message: str = ""


@dataclass(frozen=True, slots=True)
class TrimOutcome:
    """The result of `trim`: the stream's first retained entry afterwards."""

    code: int
    first_entry_id: int
    durable: Future[None] | None
    message: str = ""


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What `open` found: journal records and entries replayed, and whether the previous
    shutdown was unclean (the unclean-shutdown bit was still set)."""

    records_replayed: int
    entries_replayed: int
    unclean: bool


@dataclass
class _FlushJob:
    """One flush: the frozen cache, the stream states and journal mark captured with it."""

    snapshot: WriteCache | None
    states: dict[int, bytes]
    mark: Future[JournalPosition] | None
    waiters: list[Future[None]]


def _flush_parts(
    plan: list[tuple[int, list[int], list[Entry]]], snapshot: WriteCache, part_bytes: int
) -> Iterator[list[tuple[int, list[int], list[Entry]]]]:
    """Yields `plan` (stream id, entry ids, entries) cut into consecutive parts of about
    `part_bytes` each, in order; the part size in entries comes from the snapshot's mean entry
    size (no per-entry work)."""
    count = sum(len(ids) for _, ids, _ in plan)
    if not count:
        return
    per_part = max(1, part_bytes * count // max(snapshot.bytes, 1))
    part: list[tuple[int, list[int], list[Entry]]] = []
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


def _scan_entries(
    stream_id: int, entries: list[Entry], max_entry_bytes: int
) -> tuple[list[int], int, list[int]]:
    """Returns (entry ids, payload bytes, positions to look at closely) of a batch. A
    position is listed when its entry is oversized, has a negative id, a bad checksum or the
    TRUNCATE or ATTRIBUTES flag (rare: classified by the caller). The per-entry hot loop of
    the bookie."""
    ids: list[int] = []
    append = ids.append
    special: list[int] = []
    total = 0
    pack = _pack_entry_header
    crc = _crc32c
    for e in entries:
        entry_id = e.entry_id
        flags = e.flags
        payload = e.payload
        size = len(payload)
        append(entry_id)
        total += size
        if (
            size > max_entry_bytes
            or entry_id < 0
            or flags & _FLAGS_TO_CLASSIFY
            or crc(payload, crc(pack(stream_id, entry_id, flags, e.timestamp_ms))) != e.crc32c
        ):
            special.append(len(ids) - 1)
    return ids, total, special


def _entry_is_valid(stream_id: int, e: Entry, max_entry_bytes: int) -> bool:
    """Returns whether the entry passes the add checks (size, id, checksum)."""
    if len(e.payload) > max_entry_bytes or e.entry_id < 0:
        return False
    return checksum_ok(stream_id, e)


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
        unsafe: UnsafeSkips = SAFE,
    ) -> None:
        """`disk` is where the files and the index live, `clock` the monotonic clock in
        seconds. Without `threads`, no thread is started: the caller (the simulator) runs the
        background jobs, `commit_journal()`, `run_flush_once()` and `run_gc_due()`. `unsafe`
        turns protections off, in tests only (`stream.bookie.unsafe`)."""
        self.config = config
        self._disk = disk
        self._clock = clock
        self._threaded = threads
        # Without threads: called when a job has work (a journal group pending, a flush
        # asked for), so that the caller schedules it.
        self.on_work: Callable[[], None] | None = None
        # Called (stream_id, new_lac) on the event-loop thread when a stream's LAC rises.
        self.on_lac_advanced: Callable[[int, int], None] | None = None
        self.unclean_shutdown_detected = False
        self._write_data = config.journal_write_data
        self._max_entry_bytes = config.max_entry_bytes
        # Off only in tests that show the forged overwrite succeeding (`stream.bookie.unsafe`).
        self._refuse_overwrites = "overwrite_check" not in unsafe
        # Off only in the chaos test that shows its checker catches a superseded writer.
        self._serve_stale_adds = "add_term_check" in unsafe
        # Off only in the simulator's runs that show what a bookie without fencing lets by.
        self._serve_stale_terms = "term_check" in unsafe
        # Off only in the simulator's test that shows its checker catches a limbo bookie's
        # explicit negative (the lost entry a recovery would then truncate).
        self._limbo_unknown = "limbo_unknown" not in unsafe
        # Off only in tests that show a late Truncate deleting its term's later entries.
        self._order_truncates = "truncate_order" not in unsafe
        self._cache_max_bytes = config.write_cache_max_bytes
        self._flush_trigger_bytes = max(config.write_cache_max_bytes // 2, 1)
        # Jitter of the flush interval, seeded per bookie: the bookies of an ensemble start
        # together and would otherwise flush in step, slowing the journal commits of two of
        # them at once (an AQ = 2 ack waits for the slower of two).
        self._flush_rng = random.Random(config.bookie_id)
        self._journal = Journal(
            config.journal_path,
            max_file_bytes=config.journal_max_file_bytes,
            max_group_wait_ms=config.journal_max_group_wait_ms,
            disk=disk,
            clock=clock,
            on_group=self._journal_group,
            ack_before_sync="journal_sync" in unsafe,
        )
        self._logs = EntryLogs(
            config.ledger_path, size_limit_bytes=config.entry_log_size_limit_bytes, disk=disk
        )
        self._index = Index(config.index_path, disk=disk)
        self._index_lock = threading.Lock()
        self._gc = GarbageCollector(self._index, self._logs, self._index_lock)
        self._states: dict[int, LocalStreamState] = {}
        self._dirty: set[int] = set()
        self._limbo_count = 0
        self._active = WriteCache()
        self._snapshot: WriteCache | None = None
        self._snapshot_bytes = 0
        self._lock = threading.Lock()
        self._flush_wakeup = threading.Event()
        self._flush_signalled = False
        self._flush_waiters: list[Future[None]] = []
        self._appended_at_mark = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._opened = False
        self._closed = False
        self._failure: BaseException | None = None
        # Counters for stats().
        self._too_busy_batches = 0
        self._flushes = 0
        self._last_flush_seconds = 0.0
        self._checkpoint = JournalPosition(0, 0)
        # Clock times of the next GC, minor and major compaction rounds (set by open()).
        self._next_gc = self._next_minor = self._next_major = 0.0

    # -- lifecycle ------------------------------------------------------------------------

    def open(self) -> ReplayReport:
        """Opens the directories, sets the unclean-shutdown bit, replays the journal from the
        checkpoint (entries back into the write cache; term/truncate/trim/limbo applied in
        order) and starts the journal, flusher and GC threads. Returns what replay found;
        raises `StorageError` when the storage is corrupt or unusable."""
        invariant(not self._opened, "StreamStorage.open() is called once")
        try:
            for path in (
                self.config.journal_path,
                self.config.ledger_path,
                self.config.index_path,
            ):
                self._disk.mkdir(path)
        except OSError as e:
            raise StorageError(f"cannot create storage directories: {e}") from e
        self._index.open()
        self.unclean_shutdown_detected = self._index.unclean_bit()
        self._index.set_unclean_bit(True)
        self._states = {
            stream_id: LocalStreamState.unpack(raw)
            for stream_id, raw in self._index.load_states().items()
        }
        self._limbo_count = sum(1 for s in self._states.values() if s.limbo)
        metrics.LIMBO_STREAMS.set(self._limbo_count)
        self._logs.open()
        self._checkpoint = self._index.checkpoint()
        report = self._replay(self._checkpoint)
        self._journal.start(thread=self._threaded)
        self._opened = True
        now = self._clock()
        config = self.config
        self._next_gc = now + config.gc_interval_ms / 1000.0
        self._next_minor = now + config.compaction_interval_ms / 1000.0
        self._next_major = now + config.major_compaction_interval_ms / 1000.0
        if self._threaded:
            self._start_thread("flusher", self._run_flusher)
            self._start_thread("gc", self._run_gc)
        log.info(
            "storage.opened",
            streams=len(self._states),
            unclean=report.unclean,
            records_replayed=report.records_replayed,
            entries_replayed=report.entries_replayed,
        )
        return report

    def close(self) -> None:
        """Shuts down cleanly: a final flush, a checkpoint at the end of the journal, then
        the unclean-shutdown bit cleared last. A restart after this replays nothing."""
        if not self._opened or self._closed:
            return
        self._closed = True
        self._stop_threads()
        if self._failure is None:
            try:
                with self._lock:
                    job = self._swap(force=True)
                self._flush(job)
            except Exception:  # keep shutting down; the unclean bit stays set
                log.exception("storage.final_flush_failed")
        self._journal.stop(drain=True)
        self._logs.close()
        if self._failure is None:
            self._index.set_unclean_bit(False)
        self._index.close()
        log.info("storage.closed", clean=self._failure is None)

    def abandon(self) -> None:
        """Stops every thread without flushing and closes the files as a kill -9 would
        leave them (what was written stays in the OS page cache; pending journal records are
        dropped and their futures fail). For crash tests: reopen with a new StreamStorage."""
        if not self._opened or self._closed:
            return
        self._closed = True
        self._stop_threads()
        with self._lock:
            waiters, self._flush_waiters = self._flush_waiters, []
        for waiter in waiters:
            waiter.set_exception(StorageError("storage abandoned before the flush"))
        self._journal.stop(drain=False)
        self._logs.abandon()
        self._index.close()

    def _start_thread(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=f"storage-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _stop_threads(self) -> None:
        self._stop.set()
        self._flush_wakeup.set()
        self._gc.stop()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def _usable(self) -> str | None:
        """Returns why requests cannot be served now, or None."""
        if not self._opened or self._closed:
            return "storage is not open"
        if self._failure is not None:
            return f"storage failed: {self._failure!r}"
        if self._journal.failure is not None:
            return f"journal failed: {self._journal.failure!r}"
        return None

    # -- adds -----------------------------------------------------------------------------

    def add_batch(self, request: pb.AddRequest, raw: bytes | None = None) -> AddOutcome:
        """Stores one batch of adds for one stream; returns one code per entry.

        Checks, in order: stream_id 0 -> BAD_REQUEST for all; the term rule (term 0 ->
        BAD_REQUEST, lower -> INVALID_TERM, higher -> recorded durably first); a full write
        cache -> TOO_BUSY for all; then per entry: negative id, oversized payload or checksum
        mismatch -> BAD_REQUEST, below the first retained entry -> TRIMMED (the rest of the
        batch proceeds), at or below the LAC and replacing the stored entry with other bytes ->
        BAD_REQUEST (`stream.protocol.justified.overwrite_refusal`). An entry with the TRUNCATE
        flag deletes every higher entry. `raw`, when given, must be `request` serialized (it is
        journaled as is, saving a copy)."""
        entries = list(request.entries)
        count = len(entries)
        stream_id = request.stream_id
        unusable = self._usable()
        if unusable is not None:
            return self._add_rejected(entries, INTERNAL, 0, unusable)
        if stream_id == 0:
            return self._add_rejected(entries, BAD_REQUEST, 0, "stream_id 0 is not a stream")
        state = self._states.get(stream_id)
        local_term = state.term if state is not None else 0
        decision = self._decide(local_term, request.term, add=True)
        if not decision.serves:
            message = (
                f"term {request.term} is below the bookie's term {local_term}"
                if decision is TermDecision.REJECT
                else "an add needs a term >= 1"
            )
            return self._add_rejected(entries, decision.code, local_term, message)
        active_bytes = self._active.bytes
        if count and active_bytes and active_bytes + self._snapshot_bytes >= self._cache_max_bytes:
            self._too_busy_batches += 1
            self._want_flush()
            return self._add_rejected(entries, TOO_BUSY, local_term, "write cache full")

        ids, payload_bytes, special = _scan_entries(stream_id, entries, self._max_entry_bytes)
        codes = [OK] * count
        stored, stored_ids = entries, ids
        truncates = False
        all_stored = True
        if special:
            truncates = self._classify(stream_id, entries, special, codes)
            all_stored = BAD_REQUEST not in codes
        first_retained = state.first_entry_id if state is not None else 0
        if count and first_retained > 0 and min(ids) < first_retained:
            for i, entry_id in enumerate(ids):
                if entry_id < first_retained and codes[i] == OK:
                    codes[i] = TRIMMED
                    all_stored = False
        refused = ""
        # Only ids at or below the LAC are compared: a writer's adds are above it.
        if count and state is not None and min(ids) <= state.lac and self._refuse_overwrites:
            refused = self._refuse_overwrites_at_or_below_lac(stream_id, state.lac, entries, codes)
            if refused:
                all_stored = False
                truncates = truncates and any(
                    e.flags & FLAG_TRUNCATE for e, c in zip(entries, codes, strict=True) if c == OK
                )
        if not all_stored:
            stored = [e for e, c in zip(entries, codes, strict=True) if c == OK]
            stored_ids = [i for i, c in zip(ids, codes, strict=True) if c == OK]
            raw = None

        new_term = decision is _ACCEPT_NEW
        with self._lock:
            if state is None:
                state = self._states[stream_id] = LocalStreamState()
            durable: Future[None] | None = None
            if new_term:
                state.term = request.term
            if self._write_data:
                if stored or new_term:
                    if raw is None:
                        body = (
                            request if all_stored else self._with_entries(request, stored)
                        ).SerializeToString()
                    else:
                        body = raw
                    durable = self._journal.append(codec.REC_ADD, body)
            else:
                if new_term:
                    durable = self._journal.append(
                        codec.REC_TERM, codec.TERM_BODY.pack(stream_id, request.term)
                    )
                if stored and (truncates or request.recovery):
                    # Recovery write-backs and truncate no-ops go to the journal even so: they
                    # may overwrite an older value at their id (an earlier term's unacknowledged
                    # entry or no-op) that a flush already wrote to an entry log, and a crash
                    # must not bring that value back (a positive answer, served even in limbo:
                    # divergence). They are rare: a takeover's few entries.
                    durable = self._journal.append(
                        codec.REC_ADD,
                        (
                            request if all_stored else self._with_entries(request, stored)
                        ).SerializeToString(),
                    )
            if stored:
                self._store(stream_id, state, stored_ids, stored, truncates)
                # Read under the lock: the flusher may have swapped the caches meanwhile.
                self._active.bytes += payload_bytes + _CACHE_ENTRY_OVERHEAD_BYTES * count
            lac_advanced = request.lac > state.lac
            if lac_advanced:
                state.lac = request.lac
            if request.lafr > state.lafr:
                state.lafr = request.lafr
            self._dirty.add(stream_id)
        cache_bytes = self._active.bytes
        metrics.WRITE_CACHE_BYTES.set(cache_bytes + self._snapshot_bytes)
        if cache_bytes >= self._flush_trigger_bytes and not self._flush_signalled:
            self._flush_signalled = True
            self._want_flush()
        if lac_advanced and self.on_lac_advanced is not None:
            self._notify_lac(stream_id, state.lac)
        message = "" if all_stored else self._add_message(codes, refused)
        return AddOutcome(codes or [OK], state.term, durable, message, ids, refused)

    def _refuse_overwrites_at_or_below_lac(
        self, stream_id: int, lac: int, entries: list[Entry], codes: list[int]
    ) -> str:
        """Sets BAD_REQUEST in `codes` for the entries at or below `lac` that would replace an
        acknowledged entry with other bytes; returns the first reason ("": none)."""
        first = ""
        for i, e in enumerate(entries):
            if e.entry_id > lac or codes[i] != OK:
                continue
            try:
                stored = self._lookup(stream_id, e.entry_id)
            except StorageError as error:
                reason: str | None = f"entry {e.entry_id} cannot be compared: {error}"
            else:
                reason = overwrite_refusal(stored, e, lac)
            if reason is not None:
                codes[i] = BAD_REQUEST
                first = first or reason
        return first

    @staticmethod
    def _add_rejected(entries: list[Entry], code: int, term: int, message: str) -> AddOutcome:
        ids = [e.entry_id for e in entries]
        return AddOutcome([code] * max(len(ids), 1), term, None, message, ids)

    @staticmethod
    def _add_message(codes: list[int], refused: str = "") -> str:
        bad = codes.count(BAD_REQUEST)
        trimmed = codes.count(TRIMMED)
        parts = [refused] if refused else []
        if bad:
            parts.append(f"{bad} entries refused (negative id, oversized or checksum mismatch)")
        if trimmed:
            parts.append(f"{trimmed} entries below the first retained entry")
        return "; ".join(parts)

    def _classify(
        self, stream_id: int, entries: list[Entry], special: list[int], codes: list[int]
    ) -> bool:
        """Sets BAD_REQUEST in `codes` for the invalid entries among `special`; returns
        whether a valid TRUNCATE entry is among them."""
        truncates = False
        for i in special:
            e = entries[i]
            if not _entry_is_valid(stream_id, e, self._max_entry_bytes):
                codes[i] = BAD_REQUEST
            elif e.flags & FLAG_TRUNCATE:
                truncates = True
        return truncates

    @staticmethod
    def _with_entries(request: pb.AddRequest, entries: list[Entry]) -> pb.AddRequest:
        """Returns a copy of `request` holding only `entries` (what gets journaled)."""
        copy = pb.AddRequest(
            stream_id=request.stream_id,
            term=request.term,
            lac=request.lac,
            lafr=request.lafr,
            recovery=request.recovery,
            request_id=request.request_id,
        )
        copy.entries.extend(entries)
        return copy

    def _store(
        self,
        stream_id: int,
        state: LocalStreamState,
        ids: list[int],
        entries: list[Entry],
        truncates: bool,
    ) -> None:
        """Puts entries into the active cache in order; a TRUNCATE entry deletes every higher
        entry (cache, snapshot, index) before the entries after it are stored."""
        cached = self._active.streams.get(stream_id)
        if cached is None:
            cached = self._active.streams[stream_id] = {}
        if not truncates:
            cached.update(zip(ids, entries, strict=True))
            top = max(ids)
            if top > state.last_entry_id:
                state.last_entry_id = top
            return
        start = 0
        for position, e in enumerate(entries):
            if e.flags & FLAG_TRUNCATE:
                cached.update(
                    zip(ids[start : position + 1], entries[start : position + 1], strict=True)
                )
                state.last_entry_id = max(state.last_entry_id, ids[position])
                self._delete_above(stream_id, state, ids[position])
                start = position + 1
        if start < len(entries):
            cached.update(zip(ids[start:], entries[start:], strict=True))
            state.last_entry_id = max(state.last_entry_id, max(ids[start:]))

    def _notify_lac(self, stream_id: int, lac: int) -> None:
        hook = self.on_lac_advanced
        if hook is None:
            return
        try:
            hook(stream_id, lac)
        except Exception:  # a broken hook must not fail the add
            log.exception("storage.lac_hook_failed", stream_id=stream_id)

    # -- fence, truncate, trim, limbo -----------------------------------------------------

    def fence(self, stream_id: int, term: int) -> FenceResult:
        """Applies the term rule (a new term is recorded durably, creating the stream when
        unknown) and returns what the bookie knows of the stream's end."""
        unusable = self._usable()
        if unusable is not None:
            return FenceResult(INTERNAL, 0, -1, -1, -1, False, None, unusable)
        if stream_id == 0:
            return FenceResult(BAD_REQUEST, 0, -1, -1, -1, False, None, "stream_id 0")
        state = self._states.get(stream_id)
        local_term = state.term if state is not None else 0
        decision = self._decide(local_term, term)
        durable = None
        if decision is _ACCEPT_NEW:
            with self._lock:
                state = self._apply_term(stream_id, term)
                durable = self._journal.append(
                    codec.REC_TERM, codec.TERM_BODY.pack(stream_id, term)
                )
        if state is None:  # rejected (BAD) for a stream never seen
            return FenceResult(decision.code, 0, -1, -1, -1, False, None, "term must be >= 1")
        message = "" if decision.serves else self._term_message(decision, term, state.term)
        return FenceResult(
            decision.code,
            state.term,
            state.lac,
            state.lafr,
            state.last_entry_id,
            state.limbo,
            durable,
            message,
        )

    def _decide(self, local_term: int, term: int, *, add: bool = False) -> TermDecision:
        """The term rule (`stream.protocol.term_decision`), unless a test-only switch serves
        lower terms: every request's ("term_check", no fencing at all) or adds' only."""
        decision = term_decision(local_term, term)
        if decision is TermDecision.REJECT and (
            self._serve_stale_terms or (add and self._serve_stale_adds)
        ):
            return TermDecision.ACCEPT
        return decision

    @staticmethod
    def _term_message(decision: TermDecision, term: int, local_term: int) -> str:
        if decision is TermDecision.REJECT:
            return f"term {term} is below the bookie's term {local_term}"
        return "a term >= 1 is required"

    def truncate(self, stream_id: int, term: int, after_entry_id: int) -> TruncateOutcome:
        """Deletes every entry of the stream above `after_entry_id` (-1: all), from the
        caches and the index, durably; the term rule applies (an unknown stream is created
        with the term)."""
        unusable = self._usable()
        if unusable is not None:
            return TruncateOutcome(INTERNAL, 0, None, unusable)
        state = self._states.get(stream_id)
        local_term = state.term if state is not None else 0
        if stream_id == 0 or after_entry_id < -1:
            return TruncateOutcome(BAD_REQUEST, local_term, None, "bad stream or entry id")
        decision = self._decide(local_term, term)
        if not decision.serves:
            message = self._term_message(decision, term, local_term)
            return TruncateOutcome(decision.code, local_term, None, message)
        late = self._late_truncate(state, term, after_entry_id)
        if late is not None:
            return late
        with self._lock:
            durable = self._journal.append(
                codec.REC_TRUNCATE, codec.TRUNCATE_BODY.pack(stream_id, term, after_entry_id)
            )
            state = self._apply_truncate(stream_id, term, after_entry_id)
        return TruncateOutcome(OK, state.term, durable)

    def _late_truncate(
        self, state: LocalStreamState | None, term: int, after_entry_id: int
    ) -> TruncateOutcome | None:
        """The answer to a Truncate that must delete nothing (`truncate_decision`: a repeat
        of, or older than, the one the stream last applied in its term), or None to apply it.
        Off with the test-only "truncate_order" switch."""
        if state is None or not self._order_truncates:
            return None
        decision = truncate_decision(
            state.truncate_term, state.truncate_after, term, after_entry_id
        )
        if decision is TruncateDecision.APPLY:
            return None
        if decision is TruncateDecision.ALREADY_APPLIED:
            return TruncateOutcome(OK, state.term, None)
        message = stale_truncate_message(term, after_entry_id, state.truncate_after)
        return TruncateOutcome(BAD_REQUEST, state.term, None, message)

    def trim(self, stream_id: int, before_entry_id: int) -> TrimOutcome:
        """Drops every entry of the stream below `before_entry_id` (retention): reads below
        answer TRIMMED at once, the index and the entry logs are cleaned by GC. Never moves
        the first retained entry backwards."""
        unusable = self._usable()
        if unusable is not None:
            return TrimOutcome(INTERNAL, 0, None, unusable)
        if stream_id == 0 or before_entry_id < 0:
            return TrimOutcome(BAD_REQUEST, 0, None, "bad stream or entry id")
        state = self._states.get(stream_id)
        if state is None:
            return TrimOutcome(NO_SUCH_STREAM, 0, None, "unknown stream")
        if before_entry_id <= state.first_entry_id:
            return TrimOutcome(OK, state.first_entry_id, None)
        with self._lock:
            durable = self._journal.append(
                codec.REC_TRIM, codec.TRIM_BODY.pack(stream_id, before_entry_id)
            )
            self._apply_trim(stream_id, before_entry_id)
        return TrimOutcome(OK, state.first_entry_id, durable)

    def record_term(self, stream_id: int, term: int) -> Future[None]:
        """Raises the stream's term to at least `term` (creating its state, even at term 0),
        through the journal; returns the future of the sync. For a term learned from metadata
        (`stream.bookie.terms`): the stream is known from then on."""
        invariant(stream_id != 0 and term >= 0, "record_term needs a stream id and a term")
        unusable = self._usable()
        if unusable is not None:
            fut: Future[None] = Future()
            fut.set_running_or_notify_cancel()
            fut.set_exception(StorageError(unusable, stream_id=stream_id))
            return fut
        with self._lock:
            durable = self._journal.append(codec.REC_TERM, codec.TERM_BODY.pack(stream_id, term))
            self._apply_term(stream_id, term)
        return durable

    def set_limbo(self, stream_id: int, limbo: bool, term: int | None = None) -> Future[None]:
        """Sets or clears the stream's limbo status (creating the stream state if missing)
        and raises its term to at least `term`, through the journal; returns the future of
        the sync (BP-46 phase one and two)."""
        invariant(stream_id != 0, "set_limbo needs a stream id")
        unusable = self._usable()
        if unusable is not None:
            fut: Future[None] = Future()
            fut.set_running_or_notify_cancel()
            fut.set_exception(StorageError(unusable, stream_id=stream_id))
            return fut
        term_value = max(term or 0, 0)
        with self._lock:
            durable = self._journal.append(
                codec.REC_LIMBO, codec.LIMBO_BODY.pack(stream_id, int(limbo), term_value)
            )
            self._apply_limbo(stream_id, limbo, term_value)
        return durable

    # -- state changes shared by requests and replay (call holding _lock) ----------------

    def _state_for(self, stream_id: int) -> LocalStreamState:
        state = self._states.get(stream_id)
        if state is None:
            state = self._states[stream_id] = LocalStreamState()
        return state

    def _apply_term(self, stream_id: int, term: int) -> LocalStreamState:
        state = self._state_for(stream_id)
        if term > state.term:
            state.term = term
        self._dirty.add(stream_id)
        return state

    def _apply_truncate(self, stream_id: int, term: int, after_entry_id: int) -> LocalStreamState:
        state = self._apply_term(stream_id, term)
        self._delete_above(stream_id, state, after_entry_id)
        state.truncate_term = term
        state.truncate_after = after_entry_id
        return state

    def _apply_trim(self, stream_id: int, before_entry_id: int) -> None:
        state = self._state_for(stream_id)
        if before_entry_id <= state.first_entry_id:
            return
        state.first_entry_id = before_entry_id
        self._active.drop_below(stream_id, before_entry_id)
        snapshot = self._snapshot
        if snapshot is not None:
            # Under the index lock so that the flusher's commit sees either the old
            # snapshot dict or the filtered one, never a half state.
            with self._index_lock:
                snapshot.drop_below(stream_id, before_entry_id)
        self._dirty.add(stream_id)

    def _apply_limbo(self, stream_id: int, limbo: bool, term: int) -> None:
        state = self._state_for(stream_id)
        if term > state.term:
            state.term = term
        if state.limbo != limbo:
            state.limbo = limbo
            self._limbo_count += 1 if limbo else -1
            metrics.LIMBO_STREAMS.set(self._limbo_count)
        self._dirty.add(stream_id)

    def _delete_above(self, stream_id: int, state: LocalStreamState, after_entry_id: int) -> None:
        """Deletes the stream's entries above `after_entry_id` from the active cache, the
        snapshot and the index, and lowers last_entry_id to what remains."""
        self._active.drop_above(stream_id, after_entry_id)
        snapshot = self._snapshot
        with self._index_lock:
            if snapshot is not None:
                snapshot.drop_above(stream_id, after_entry_id)
            self._index.delete_range(stream_id, after_entry_id + 1, _MAX_ENTRY_ID)
        if state.last_entry_id > after_entry_id:
            held = [
                self._active.max_entry_id(stream_id, after_entry_id),
                self._index.max_entry_id(stream_id, after_entry_id),
            ]
            if snapshot is not None:
                held.append(snapshot.max_entry_id(stream_id, after_entry_id))
            state.last_entry_id = max(held)
        self._dirty.add(stream_id)

    # -- reads ----------------------------------------------------------------------------

    def read(self, stream_id: int, entry_id: int, term: int = 0) -> ReadResult:
        """Returns one entry. With `term` > 0 (a recovery read) the term rule applies first,
        and a new term is recorded durably, even for a stream never seen (the TLA+ spec fences
        on recovery reads). TRIMMED below the first retained entry, NO_SUCH_ENTRY when not
        held, NO_SUCH_STREAM for an unknown stream; in limbo an explicit negative becomes
        UNKNOWN."""
        unusable = self._usable()
        if unusable is not None:
            return ReadResult(INTERNAL, None, -1, 0, 0, None, unusable)
        state = self._states.get(stream_id)
        durable = None
        if term:
            local_term = state.term if state is not None else 0
            decision = self._decide(local_term, term)
            if not decision.serves:
                message = self._term_message(decision, term, local_term)
                if state is None:
                    return ReadResult(decision.code, None, -1, 0, 0, None, message)
                return ReadResult(
                    decision.code, None, state.lac, state.term, state.first_entry_id, None, message
                )
            if decision is _ACCEPT_NEW:
                with self._lock:
                    state = self._apply_term(stream_id, term)
                    durable = self._journal.append(
                        codec.REC_TERM, codec.TERM_BODY.pack(stream_id, term)
                    )
        if state is None:
            return ReadResult(NO_SUCH_STREAM, None, -1, 0, 0, None, "unknown stream")
        if entry_id < 0:
            return ReadResult(
                BAD_REQUEST, None, state.lac, state.term, state.first_entry_id, durable, "id < 0"
            )
        if entry_id < state.first_entry_id:
            return ReadResult(
                TRIMMED, None, state.lac, state.term, state.first_entry_id, durable, "trimmed"
            )
        try:
            entry = self._lookup(stream_id, entry_id)
        except StorageError as e:
            log.error("storage.read_failed", stream_id=stream_id, entry_id=entry_id, error=str(e))
            return ReadResult(
                INTERNAL, None, state.lac, state.term, state.first_entry_id, durable, str(e)
            )
        code = OK if entry is not None else self._negative(state)
        return ReadResult(code, entry, state.lac, state.term, state.first_entry_id, durable, "")

    def _negative(self, state: LocalStreamState) -> int:
        """Returns the answer for an entry the stream lacks: NO_SUCH_ENTRY, or UNKNOWN in
        limbo (the entry may be one the bookie lost)."""
        return limbo_code(NO_SUCH_ENTRY, state.limbo and self._limbo_unknown)

    def _lookup(self, stream_id: int, entry_id: int) -> Entry | None:
        # Order matters: active cache, then snapshot, then index. The flusher swaps
        # active -> snapshot and drops the snapshot only after the index commit, so an entry
        # is always in one of the places looked at later.
        cached = self._active.streams.get(stream_id)
        if cached is not None:
            entry = cached.get(entry_id)
            if entry is not None:
                return entry
        snapshot = self._snapshot
        if snapshot is not None:
            cached = snapshot.streams.get(stream_id)
            if cached is not None:
                entry = cached.get(entry_id)
                if entry is not None:
                    return entry
        for _ in range(3):
            location = self._index.get(stream_id, entry_id)
            if location is None:
                return None
            try:
                return self._logs.read_entry(location)
            except EntryLogGone:
                continue  # compaction moved it and deleted the old log: look again
        raise StorageError("entry log vanished under a read", stream_id=stream_id)

    def read_range(
        self, stream_id: int, first: int, last: int, max_batch_bytes: int = 0, *, raw: bool = False
    ) -> Iterator[tuple[int, list[Any]]]:
        """Yields (code, entries) batches of [first, last] of at most about
        `max_batch_bytes` of payload (0: read_range_batch_bytes). Stops at the first entry
        not held: the last batch carries the code of the stop (OK when the whole range was
        returned; NO_SUCH_ENTRY, UNKNOWN in limbo, TRIMMED, NO_SUCH_STREAM...). With `raw`,
        the entries come serialized (bytes-like: the entry log's records as stored, never
        parsed), for a server that frames them into its answer as they are."""
        max_bytes = max_batch_bytes if max_batch_bytes > 0 else self.config.read_range_batch_bytes
        return self._read_range(stream_id, first, last, max_bytes, raw)

    def _read_range(
        self, stream_id: int, first: int, last: int, max_bytes: int, raw: bool
    ) -> Iterator[tuple[int, list[Any]]]:
        unusable = self._usable()
        if unusable is not None:
            yield INTERNAL, []
            return
        if self._states.get(stream_id) is None:
            yield NO_SUCH_STREAM, []
            return
        if first < 0 or last < first:
            yield BAD_REQUEST, []
            return
        entry_id = first
        while True:
            state = self._states[stream_id]
            if entry_id < state.first_entry_id:
                yield TRIMMED, []
                return
            try:
                batch, entry_id, found_all = self._read_batch(
                    stream_id, entry_id, last, max_bytes, raw
                )
            except StorageError as e:
                log.error("storage.read_range_failed", stream_id=stream_id, error=str(e))
                yield INTERNAL, []
                return
            if not found_all:
                yield self._negative(state), batch
                return
            if entry_id > last:
                yield OK, batch
                return
            yield OK, batch

    def _read_batch(
        self, stream_id: int, entry_id: int, last: int, max_bytes: int, raw: bool = False
    ) -> tuple[list[Any], int, bool]:
        """Returns (entries from `entry_id` on, next entry id, whether no entry was missing)
        for one batch of at most `max_bytes` (at least one entry); serialized with `raw`."""
        active = self._active.streams.get(stream_id) or {}
        snapshot = self._snapshot
        snap = (snapshot.streams.get(stream_id) if snapshot is not None else None) or {}
        batch: list[Any] = []
        size = 0
        located: list[bytes] = []  # index locations of ids located_first, located_first + 1...
        located_first = entry_id
        while entry_id <= last and (size < max_bytes or not batch):
            entry = active.get(entry_id)
            if entry is None:
                entry = snap.get(entry_id)
            if entry is not None:
                batch.append(_serialize_entry(entry) if raw else entry)
                size += len(entry.payload) + _ENTRY_OVERHEAD_BYTES
                entry_id += 1
                continue
            if entry_id - located_first >= len(located):
                count = min(last - entry_id + 1, _RANGE_PREFETCH)
                located = self._index.consecutive(stream_id, entry_id, count)
                located_first = entry_id
                if not located:
                    return batch, entry_id, False
            run = self._index_run(
                located[entry_id - located_first :], active, snap, entry_id, max_bytes - size
            )
            entries = self._read_located(stream_id, entry_id, run, raw)
            batch.extend(entries)
            size += sum(map(len, entries)) if raw else sum(len(e.payload) for e in entries)
            size += _ENTRY_OVERHEAD_BYTES * len(entries)
            entry_id += len(entries)
            if len(entries) < len(run):
                return batch, entry_id, False
        return batch, entry_id, True

    @staticmethod
    def _index_run(
        located: list[bytes],
        active: dict[int, Entry],
        snap: dict[int, Entry],
        entry_id: int,
        budget: int,
    ) -> Locations:
        """Returns, parsed, the first of `located` (the index locations of `entry_id`,
        `entry_id + 1`...): up to the first id the write caches hold (newer than its index
        location), within `budget` bytes (at least one)."""
        n = len(located)
        for cache in (active, snap):
            if cache and n > 1:
                held = next(filter(cache.__contains__, range(entry_id + 1, entry_id + n)), None)
                if held is not None:
                    n = held - entry_id
        run = _parse_locations(located[:n])
        within = bisect_left(list(accumulate(run.lengths)), budget) + 1
        return run.cut(within) if within < n else run

    def _read_located(
        self, stream_id: int, first_id: int, run: Locations, raw: bool = False
    ) -> list[Any]:
        """Returns the entries first_id, first_id + 1... at the locations `run` (serialized,
        as stored, with `raw`), reading adjacent records with one pread."""
        header = codec.ENTRY_RECORD_HEADER_BYTES
        logs, offsets, lengths = run.logs, run.offsets, run.lengths
        ends = list(map(add, offsets, lengths))
        if logs.count(logs[0]) == len(logs) and all(
            map(eq, map(sub, offsets[1:], ends), repeat(header))
        ):
            groups = [(0, len(logs))]  # the usual case, one span, told without a Python loop
        else:
            groups = []
            i = 0
            while i < len(logs):
                j = i + 1
                while j < len(logs) and logs[j] == logs[i] and offsets[j] == ends[j - 1] + header:
                    j += 1
                groups.append((i, j))
                i = j
        entries: list[Any] = []
        for i, j in groups:
            base = offsets[i]
            try:
                span = self._logs.read_span(logs[i], base, ends[j - 1] - base)
            except EntryLogGone:
                # Compaction moved these entries meanwhile: look each one up again.
                for entry_id in range(first_id + i, first_id + j):
                    entry = self._lookup(stream_id, entry_id)
                    if entry is None:
                        return entries  # deleted meanwhile: the range stops here
                    entries.append(_serialize_entry(entry) if raw else entry)
                continue
            # Bytes slices (copies), not memoryviews: bytes are no work for the cyclic GC, which
            # a memoryview per entry kept busy.
            starts = map(sub, offsets[i:j], repeat(base))
            stops = map(sub, ends[i:j], repeat(base))
            records = map(span.__getitem__, map(slice, starts, stops))
            entries.extend(records if raw else map(Entry.FromString, records))
        return entries

    def lac(self, stream_id: int) -> tuple[int, int] | None:
        """Returns the stream's (lac, lafr), or None for an unknown stream."""
        state = self._states.get(stream_id)
        return (state.lac, state.lafr) if state is not None else None

    def stream_state(self, stream_id: int) -> StreamStateView | None:
        """Returns an immutable view of the stream's state, or None when unknown."""
        state = self._states.get(stream_id)
        return state.view() if state is not None else None

    def term(self, stream_id: int) -> int:
        """Returns the stream's term (0: unknown; cheap: no view is built)."""
        state = self._states.get(stream_id)
        return state.term if state is not None else 0

    def knows(self, stream_id: int) -> bool:
        """Returns whether the bookie holds state for the stream (cheap: no view is built)."""
        return stream_id in self._states

    def stream_ids(self) -> list[int]:
        """Returns the ids of every stream this bookie knows."""
        return list(self._states)

    # -- repair (BP-46 phase two) ---------------------------------------------------------

    def missing_entry_ids(self, stream_id: int, entry_ids: list[int]) -> list[int]:
        """Returns those of `entry_ids` (ascending) that the bookie does not hold, looking at
        the write caches and the index only (no entry data is read): what a repair must copy.
        An id below the stream's first retained entry is never missing."""
        if not entry_ids:
            return []
        state = self._states.get(stream_id)
        first_retained = state.first_entry_id if state is not None else 0
        # Same order as `_lookup`: active cache, snapshot, then index (the flusher moves entries
        # active -> snapshot -> index, and drops the snapshot only after the index commit).
        active = self._active.streams.get(stream_id) or {}
        snapshot = self._snapshot
        snap = (snapshot.streams.get(stream_id) if snapshot is not None else None) or {}
        missing: list[int] = []
        for start in range(0, len(entry_ids), _RANGE_PREFETCH):
            chunk = entry_ids[start : start + _RANGE_PREFETCH]
            span = chunk[-1] - chunk[0] + 1
            located = self._index.locations(stream_id, chunk[0], chunk[-1], span)
            for entry_id in chunk:
                if (
                    entry_id >= first_retained
                    and entry_id not in active
                    and entry_id not in snap
                    and entry_id not in located
                ):
                    missing.append(entry_id)
        return missing

    def store_copies(self, stream_id: int, entries: list[Entry]) -> int:
        """Stores entries that a repair copied from peers; returns how many were stored.

        Each entry the bookie does not hold yet, at or above the first retained entry and with
        a valid checksum, goes into the write cache as an add would, with two differences: it
        skips the journal (the repair flushes before it clears limbo, so a crash before that
        just repeats the repair), and a TRUNCATE flag deletes nothing (the copy is an old entry
        whose truncation this bookie already applied or never needed; entries above it may be
        newer and must stay). Raises `StorageError` when the storage is unusable."""
        unusable = self._usable()
        if unusable is not None:
            raise StorageError(unusable, stream_id=stream_id)
        state = self._states.get(stream_id)
        if state is None or not entries:
            return 0
        stored = 0
        stored_bytes = 0
        # One index read for the batch. An entry flushed between it and the checks below was
        # added meanwhile with the same (committed) bytes: storing it again changes nothing.
        ids = [e.entry_id for e in entries]
        low, high = min(ids), max(ids)
        indexed = self._index.locations(stream_id, low, high, high - low + 1)
        with self._lock:
            cached = self._active.streams.get(stream_id)
            if cached is None:
                cached = self._active.streams[stream_id] = {}
            snapshot = self._snapshot
            snap = (snapshot.streams.get(stream_id) if snapshot is not None else None) or {}
            for e in entries:
                entry_id = e.entry_id
                if (
                    entry_id < state.first_entry_id
                    or entry_id in cached
                    or entry_id in snap
                    or entry_id in indexed
                    or not _entry_is_valid(stream_id, e, self._max_entry_bytes)
                ):
                    continue
                cached[entry_id] = e
                stored += 1
                stored_bytes += len(e.payload) + _CACHE_ENTRY_OVERHEAD_BYTES
                if entry_id > state.last_entry_id:
                    state.last_entry_id = entry_id
            self._active.bytes += stored_bytes
            self._dirty.add(stream_id)
        if self._active.bytes >= self._flush_trigger_bytes and not self._flush_signalled:
            self._flush_signalled = True
            self._want_flush()
        return stored

    # -- flushing -------------------------------------------------------------------------

    def request_flush(self) -> Future[None]:
        """Asks the flusher for a flush now; returns a future completed once everything added
        before this call is in entry logs and the index (and the checkpoint moved)."""
        fut: Future[None] = Future()
        fut.set_running_or_notify_cancel()
        unusable = self._usable()
        if unusable is not None:
            fut.set_exception(StorageError(unusable))
            return fut
        with self._lock:
            self._flush_waiters.append(fut)
        self._want_flush()
        return fut

    def _swap(self, *, force: bool = False) -> _FlushJob:
        """Returns the next flush job: freezes the active cache into the snapshot and
        captures the dirty stream states and a journal mark, atomically (call holding
        _lock). The job has no snapshot when there is nothing to flush."""
        waiters, self._flush_waiters = self._flush_waiters, []
        active = self._active
        journal_moved = self._journal.appended_records != self._appended_at_mark
        if not active.streams and not self._dirty and not journal_moved and not force:
            return _FlushJob(None, {}, None, waiters)
        invariant(self._snapshot is None, "one flush at a time")
        active.frozen = True
        self._snapshot = active
        self._snapshot_bytes = active.bytes
        self._active = WriteCache()
        states = {stream_id: self._states[stream_id].pack() for stream_id in self._dirty}
        self._dirty = set()
        mark = self._journal.mark() if self._opened else None
        self._appended_at_mark = self._journal.appended_records
        self._flush_signalled = False
        return _FlushJob(active, states, mark, waiters)

    def _flush(self, job: _FlushJob, checkpoint: JournalPosition | None = None) -> None:
        """Writes a flush job: entry logs (synced), then one LMDB transaction with the
        locations, the states and the checkpoint (synced), then deletes the journal files
        before the checkpoint and completes the job's waiters."""
        snapshot = job.snapshot
        if snapshot is None:
            for waiter in job.waiters:
                waiter.set_result(None)
            return
        started = self._clock()
        try:
            # A C-level copy: the event loop may replace a stream's dict meanwhile.
            streams = sorted(snapshot.streams.items())
            plan = []
            for stream_id, cached in streams:
                if cached:
                    entry_ids = sorted(cached)
                    plan.append((stream_id, entry_ids, list(map(cached.__getitem__, entry_ids))))
            with self._logs.lock:
                self._logs.begin_flush()
                keys, locations, written = [], [], 0
                # Synced part by part: a journal fdatasync that runs beside an entry-log
                # fdatasync waits for that one's writeback (one ext4 transaction), so every
                # sync here is kept short.
                for part in _flush_parts(plan, snapshot, _FLUSH_SYNC_BYTES):
                    part_keys, part_locations, part_written = self._logs.write_entries(part)
                    keys += part_keys
                    locations += part_locations
                    written += part_written
                    self._logs.sync()
            if checkpoint is None and job.mark is not None:
                if not self._threaded and not job.mark.done():
                    # No journal thread to write the mark: the flush commits the group itself.
                    self._journal.commit_pending()
                checkpoint = job.mark.result()
            with self._index_lock:
                keys, locations = self._drop_deleted(snapshot, streams, plan, keys, locations)
                self._index.commit_flush(keys, locations, job.states, checkpoint)
                self._logs.end_flush()
            self._index.sync()
        except BaseException as e:
            self._logs.end_flush()
            self._fail(e)
            for waiter in job.waiters:
                waiter.set_exception(StorageError(f"flush failed: {e!r}"))
            raise
        self._snapshot = None
        self._snapshot_bytes = 0
        if checkpoint is not None:
            self._checkpoint = checkpoint
            self._journal.delete_before(checkpoint.seq)
        elapsed = self._clock() - started
        self._flushes += 1
        self._last_flush_seconds = elapsed
        metrics.FLUSH_SECONDS.observe(elapsed)
        metrics.WRITE_CACHE_BYTES.set(self._active.bytes)
        log.debug("storage.flushed", entries=len(keys), bytes=written, seconds=round(elapsed, 4))
        for waiter in job.waiters:
            waiter.set_result(None)

    @staticmethod
    def _drop_deleted(
        snapshot: WriteCache,
        streams: list[tuple[int, dict[int, Entry]]],
        plan: list[tuple[int, list[int], list[Entry]]],
        keys: list[bytes],
        locations: list[bytes],
    ) -> tuple[list[bytes], list[bytes]]:
        """Returns the keys and locations of a flush without the entries that a truncate or
        trim deleted from the snapshot while it was written (call holding the index lock)."""
        changed = {
            stream_id
            for stream_id, cached in streams
            if snapshot.streams.get(stream_id) is not cached
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

    def _fail(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
            log.error("storage.failed", error=repr(error))

    def _run_flusher(self) -> None:
        while not self._stop.is_set():
            self._flush_wakeup.wait(self.next_flush_delay_s())
            if self._stop.is_set():
                break
            try:
                self.run_flush_once()
            except Exception:
                log.exception("storage.flusher_failed")
                return
        # Flush waiters left at stop are served by close()'s final flush (or failed by
        # abandon()).

    # -- the background jobs, one step each (run by the threads, or by a simulator) -------

    def _journal_group(self) -> None:
        if self.on_work is not None:
            self.on_work()

    def commit_journal(self) -> bool:
        """Commits the pending journal records (one write, one fdatasync); returns whether
        there were any. The journal thread's step, for a storage opened without threads."""
        return self._journal.commit_pending()

    def write_journal(self) -> bool:
        """Writes the pending journal records without syncing them: the first half of
        `commit_journal`, for a caller that gives the fdatasync virtual time (the simulator);
        `sync_journal()` is the second. Returns whether any were pending."""
        return self._journal.write_pending()

    def sync_journal(self) -> bool:
        """Syncs what `write_journal` wrote and acknowledges it; returns whether it wrote."""
        return self._journal.sync_written()

    def _want_flush(self) -> None:
        self._flush_wakeup.set()
        if self.on_work is not None:
            self.on_work()

    def flush_wanted(self) -> bool:
        """Returns whether a flush was asked for (a full write cache or `request_flush`)
        since the last one."""
        return self._flush_wakeup.is_set()

    def next_flush_delay_s(self) -> float:
        """Returns how long the flusher waits for a wake-up before a timed flush (the
        interval, jittered per bookie)."""
        interval_s = self.config.flush_interval_ms / 1000.0
        return interval_s * self._flush_rng.uniform(0.75, 1.25)

    def run_flush_once(self) -> None:
        """Flushes the write cache now (entry logs, index, checkpoint): the flusher's step.
        Raises what the flush raised (the storage is then failed)."""
        self._flush_wakeup.clear()
        with self._lock:
            job = self._swap()
        self._flush(job)

    # -- replay ---------------------------------------------------------------------------

    def _replay(self, checkpoint: JournalPosition) -> ReplayReport:
        records = 0
        entries = 0
        for record in replay(self.config.journal_path, checkpoint, self._disk):
            records += 1
            with self._lock:
                entries += self._replay_record(record.type, record.payload)
            if self._active.bytes >= self._flush_trigger_bytes:
                # The journal holds more than the cache should: flush part of it now, with a
                # checkpoint right after the record just applied.
                with self._lock:
                    job = self._swap(force=True)
                self._flush(job, checkpoint=record.position)
        if records:
            log.info("storage.replayed", records=records, entries=entries, checkpoint=checkpoint)
        return ReplayReport(records, entries, self.unclean_shutdown_detected)

    def _replay_record(self, record_type: int, payload: bytes) -> int:
        """Applies one journal record; returns the entries it put back into the cache."""
        if record_type == codec.REC_ADD:
            request = pb.AddRequest.FromString(payload)
            return self._replay_add(request)
        if record_type == codec.REC_TERM:
            stream_id, term = codec.TERM_BODY.unpack(payload)
            self._apply_term(stream_id, term)
        elif record_type == codec.REC_TRUNCATE:
            stream_id, term, after_entry_id = codec.TRUNCATE_BODY.unpack(payload)
            self._apply_truncate(stream_id, term, after_entry_id)
        elif record_type == codec.REC_TRIM:
            stream_id, before_entry_id = codec.TRIM_BODY.unpack(payload)
            self._apply_trim(stream_id, before_entry_id)
        elif record_type == codec.REC_LIMBO:
            stream_id, limbo, term = codec.LIMBO_BODY.unpack(payload)
            self._apply_limbo(stream_id, bool(limbo), term)
        else:
            raise StorageError("unknown journal record type", type=record_type)
        return 0

    def _replay_add(self, request: pb.AddRequest) -> int:
        stream_id = request.stream_id
        state = self._apply_term(stream_id, request.term)
        entries = list(request.entries)
        if state.first_entry_id > 0:
            entries = [e for e in entries if e.entry_id >= state.first_entry_id]
        if entries:
            ids = [e.entry_id for e in entries]
            truncates = any(e.flags & FLAG_TRUNCATE for e in entries)
            self._store(stream_id, state, ids, entries, truncates)
            self._active.bytes += sum(len(e.payload) for e in entries)
            self._active.bytes += _CACHE_ENTRY_OVERHEAD_BYTES * len(entries)
        if request.lac > state.lac:
            state.lac = request.lac
        if request.lafr > state.lafr:
            state.lafr = request.lafr
        return len(entries)

    # -- GC -------------------------------------------------------------------------------

    def gc_once(self) -> GcReport:
        """Runs one garbage collection now: drops trimmed entries from the index and deletes
        the entry logs without live entries (never the current one); returns what it did."""
        return self._gc.gc_once(self._trim_points())

    def compact_once(self, threshold: float, kind: str = "manual") -> CompactionReport:
        """Runs one compaction now: rewrites the live entries of logs whose live ratio is
        below `threshold` (0 disables) into the current log and deletes the old logs."""
        return self._gc.compact_once(threshold, self._trim_points(), kind=kind)

    def _trim_points(self) -> dict[int, int]:
        # dict() copies in C (atomic under the GIL) while the event loop may add streams.
        states = dict(self._states)
        return {sid: s.first_entry_id for sid, s in states.items() if s.first_entry_id > 0}

    def _run_gc(self) -> None:
        while not self._stop.is_set():
            if self._stop.wait(max(self.next_gc_due() - self._clock(), 0.0)):
                break
            try:
                self.run_gc_due()
            except Exception:
                log.exception("storage.gc_failed")

    def next_gc_due(self) -> float:
        """Returns the clock time of the next GC or compaction round."""
        return min(self._next_gc, self._next_minor, self._next_major)

    def run_gc_due(self) -> None:
        """Runs the GC and compaction rounds that are due by the clock: the GC thread's
        step. Blocks for the round's length."""
        config = self.config
        now = self._clock()
        if now >= self._next_major:
            self._next_major = now + config.major_compaction_interval_ms / 1000.0
            self.compact_once(config.major_compaction_threshold, kind="major")
        elif now >= self._next_minor:
            self._next_minor = now + config.compaction_interval_ms / 1000.0
            self.compact_once(config.minor_compaction_threshold, kind="minor")
        if now >= self._next_gc:
            self._next_gc = now + config.gc_interval_ms / 1000.0
            self.gc_once()

    # -- stats ----------------------------------------------------------------------------

    def stats(self) -> dict[str, object]:
        """Returns counters and sizes for Info, logs and tests."""
        return {
            "streams": len(self._states),
            "limbo_streams": self._limbo_count,
            "write_cache_bytes": self._active.bytes + self._snapshot_bytes,
            "entry_logs": len(self._logs.log_ids()),
            "entry_log_bytes": self._logs.disk_bytes(),
            "journal_bytes": self._journal.disk_bytes(),
            "journal_bytes_written": self._journal.bytes_written,
            "entry_log_bytes_written": self._logs.bytes_written,
            "index_entries": self._index.entry_count() if self._index_open() else 0,
            "index_bytes": self._index.disk_bytes(),
            "too_busy_batches": self._too_busy_batches,
            "flushes": self._flushes,
            "last_flush_seconds": self._last_flush_seconds,
            "checkpoint": tuple(self._checkpoint),
            "unclean_shutdown_detected": self.unclean_shutdown_detected,
            "failed": self._failure is not None,
        }

    def _index_open(self) -> bool:
        return self._opened and not self._closed
