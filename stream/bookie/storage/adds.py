"""The add path: a batch of entries of one stream checked (term rule, write cache room, per
entry size, id, checksum, trim point, no overwrite of an acknowledged entry), journaled and put
into the write cache; and the entries a BP-46 repair copies from peers.

`_scan_entries` is the bookie's per-entry hot loop: keep per-entry work out of everything else
here (issue 22 measures CPU microseconds per entry)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

from stream.bookie.codes import (
    BAD_REQUEST,
    FLAG_ATTRIBUTES,
    FLAG_TRUNCATE,
    INTERNAL,
    OK,
    TOO_BUSY,
    TRIMMED,
    wire_code,
)
from stream.bookie.storage import codec
from stream.bookie.storage.flusher import Flusher
from stream.bookie.storage.outcomes import AddOutcome
from stream.bookie.storage.rules import RequestRules
from stream.bookie.storage.scanned import AddRequest, ScannedAdd, entry_ids
from stream.bookie.storage.store import Store
from stream.bookie.storage.write_cache import ENTRY_OVERHEAD_BYTES
from stream.bookie.unsafe import UnsafeSkips
from stream.errors import StorageError
from stream.framing import native
from stream.framing.verify import checksum_ok
from stream.logs import get_logger
from stream.protocol.checksum import ENTRY_HEADER
from stream.protocol.justified import overwrite_refusal
from stream.protocol.terms import TermDecision
from stream.wire import bookie_pb2 as pb

log = get_logger(__name__)

Entry = pb.Entry
# Entries with these flags are classified one by one, off the hot loop: a TRUNCATE takes
# effect, and an entry's ATTRIBUTES extend its checksum.
_FLAGS_TO_CLASSIFY = FLAG_TRUNCATE | FLAG_ATTRIBUTES
_ACCEPT_NEW = TermDecision.ACCEPT_NEW
_REJECT = TermDecision.REJECT
# Hot path: the entry checksum of stream/protocol/checksum.py (`entry_checksum`) inlined with
# its own precompiled header struct, because a function call per entry shows in profiles.
# tests/unit/bookie/test_storage_add.py checks that both agree.
_pack_entry_header = ENTRY_HEADER.pack
_crc32c = native.crc32c
_serialize = Entry.SerializeToString


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


def _add_rejected(request: AddRequest, code: pb.Code, term: int, message: str) -> AddOutcome:
    ids = entry_ids(request)
    return AddOutcome([code] * max(len(ids), 1), term, None, message, ids)


def _add_message(codes: list[pb.Code], refused: str = "") -> str:
    bad = codes.count(BAD_REQUEST)
    trimmed = codes.count(TRIMMED)
    parts = [refused] if refused else []
    if bad:
        parts.append(f"{bad} entries refused (negative id, oversized or checksum mismatch)")
    if trimmed:
        parts.append(f"{trimmed} entries below the first retained entry")
    return "; ".join(parts)


def _messages(request: AddRequest, entries: list[Entry] | None) -> list[Entry]:
    """Returns `entries`, or else the entries of `request` as messages (made now)."""
    if entries is not None:
        return entries
    return request.entries if isinstance(request, ScannedAdd) else list(request.entries)


def _has_entries(request: AddRequest) -> bool:
    return bool(request.ids if isinstance(request, ScannedAdd) else request.entries)


def _journaled(
    request: AddRequest,
    raw: bytes | None,
    all_stored: bool,
    stored: list[Entry] | None,
) -> bytes:
    """Returns the journal record of a batch: `raw` (the request as received) when given, else
    the request holding only the `stored` entries, serialized."""
    if raw is not None:
        return raw
    if all_stored and not isinstance(request, ScannedAdd):
        return request.SerializeToString()
    # A ScannedAdd loses its bytes only when some entries go: those were made messages.
    assert stored is not None
    return _with_entries(request, stored).SerializeToString()


def _with_entries(request: AddRequest, entries: list[Entry]) -> pb.AddRequest:
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


class AddPath:
    """Adds and repair copies into one `Store`. `on_lac_advanced` is called (stream_id,
    new_lac) on the event-loop thread when a stream's LAC rises. `unsafe` turns the overwrite
    check off, in tests only (`stream.bookie.unsafe`)."""

    def __init__(
        self, store: Store, rules: RequestRules, flusher: Flusher, unsafe: UnsafeSkips
    ) -> None:
        config = store.config
        self._store = store
        self._rules = rules
        self._flusher = flusher
        self.on_lac_advanced: Callable[[int, int], None] | None = None
        self._write_data = config.journal_write_data
        self._max_entry_bytes = config.max_entry_bytes
        self._cache_max_bytes = config.write_cache_max_bytes
        self._flush_trigger_bytes = flusher.trigger_bytes
        # Off only in tests that show the forged overwrite succeeding (`stream.bookie.unsafe`).
        self._refuse_overwrites = "overwrite_check" not in unsafe
        self.too_busy_batches = 0

    def add_batch(self, request: AddRequest, raw: bytes | None = None) -> AddOutcome:
        """Stores one batch of adds for one stream; returns one code per entry.

        Checks, in order: stream_id 0 -> BAD_REQUEST for all; the term rule (term 0 ->
        BAD_REQUEST, lower -> INVALID_TERM, higher -> recorded durably first); a full write
        cache -> TOO_BUSY for all; then per entry: negative id, oversized payload or checksum
        mismatch -> BAD_REQUEST, below the first retained entry -> TRIMMED (the rest of the
        batch proceeds), at or below the LAC and replacing the stored entry with other bytes ->
        BAD_REQUEST (`stream.protocol.justified.overwrite_refusal`). An entry with the TRUNCATE
        flag deletes every higher entry. `raw`, when given, must be `request` serialized (it is
        journaled as is, saving a copy). A `ScannedAdd` (`stream.bookie.storage.scanned`) is
        served the same, its entries made messages only when one of them is looked at."""
        store = self._store
        stream_id = request.stream_id
        unusable = store.usable()
        if unusable is not None:
            return _add_rejected(request, INTERNAL, 0, unusable)
        if stream_id == 0:
            return _add_rejected(request, BAD_REQUEST, 0, "stream_id 0 is not a stream")
        state = store.states.get(stream_id)
        local_term = state.term if state is not None else 0
        decision = self._rules.decide(local_term, request.term, add=True)
        if not decision.serves:
            message = (
                f"term {request.term} is below the bookie's term {local_term}"
                if decision is _REJECT
                else "an add needs a term >= 1"
            )
            return _add_rejected(request, wire_code(decision.code), local_term, message)
        active_bytes = store.active.bytes
        if (
            active_bytes
            and active_bytes + store.snapshot_bytes >= self._cache_max_bytes
            and _has_entries(request)
        ):
            self.too_busy_batches += 1
            self._flusher.want_flush()
            return _add_rejected(request, TOO_BUSY, local_term, "write cache full")

        # The entries as messages (None: not made, the scan gave what the hot path needs) and
        # serialized (None: not yet).
        entries: list[Entry] | None
        datas: list[bytes] | None
        if isinstance(request, ScannedAdd):
            raw = request.raw
            ids, payload_bytes, special = request.ids, request.payload_bytes, request.special
            entries, datas = None, request.datas
            if special:
                entries = request.entries
        else:
            entries, datas = list(request.entries), None
            ids, payload_bytes, special = _scan_entries(stream_id, entries, self._max_entry_bytes)
        count = len(ids)
        codes = [OK] * count
        truncates = False
        all_stored = True
        if special:
            assert entries is not None
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
            entries = _messages(request, entries)
            refused = self._refuse_overwrites_at_or_below_lac(stream_id, state.lac, entries, codes)
            if refused:
                all_stored = False
                truncates = truncates and any(
                    e.flags & FLAG_TRUNCATE for e, c in zip(entries, codes, strict=True) if c == OK
                )
        stored_ids = ids
        stored: list[Entry] | None = entries
        if not all_stored:
            entries = _messages(request, entries)
            stored = [e for e, c in zip(entries, codes, strict=True) if c == OK]
            stored_ids = [i for i, c in zip(ids, codes, strict=True) if c == OK]
            if datas is not None:
                datas = [d for d, c in zip(datas, codes, strict=True) if c == OK]
            raw = None
        # Where each stored TRUNCATE entry is (it deletes the entries above it).
        truncate_at: list[int] = []
        if truncates and stored_ids:
            assert stored is not None
            truncate_at = [i for i, e in enumerate(stored) if e.flags & FLAG_TRUNCATE]
        if stored_ids and datas is None:
            assert stored is not None
            datas = list(map(_serialize, stored))

        new_term = decision is _ACCEPT_NEW
        with store.lock:
            if state is None:
                state = store.state_for(stream_id)
            durable: Future[None] | None = None
            if new_term:
                state.term = request.term
            journal = store.journal
            if self._write_data:
                if stored_ids or new_term:
                    durable = journal.append(
                        codec.REC_ADD, _journaled(request, raw, all_stored, stored)
                    )
            else:
                if new_term:
                    durable = journal.append(
                        codec.REC_TERM, codec.TERM_BODY.pack(stream_id, request.term)
                    )
                if stored_ids and (truncates or request.recovery):
                    # Recovery write-backs and truncate no-ops go to the journal even so: they
                    # may overwrite an older value at their id (an earlier term's unacknowledged
                    # entry or no-op) that a flush already wrote to an entry log, and a crash
                    # must not bring that value back (a positive answer, served even in limbo:
                    # divergence). They are rare: a takeover's few entries.
                    durable = journal.append(
                        codec.REC_ADD, _journaled(request, raw, all_stored, stored)
                    )
            if new_term:
                store.term_recorded(stream_id, durable)
            elif durable is None:
                durable = store.unsynced_term(stream_id)
            if stored_ids:
                assert datas is not None
                store.put_entries(stream_id, state, stored_ids, datas, truncate_at)
                # Read under the lock: the flusher may have swapped the caches meanwhile.
                store.active.bytes += payload_bytes + ENTRY_OVERHEAD_BYTES * count
            lac_advanced = request.lac > state.lac
            if lac_advanced:
                state.lac = request.lac
            if request.lafr > state.lafr:
                state.lafr = request.lafr
            store.dirty.add(stream_id)
        if store.active.bytes >= self._flush_trigger_bytes:
            self._flusher.cache_full()
        if lac_advanced and self.on_lac_advanced is not None:
            self._notify_lac(stream_id, state.lac)
        message = "" if all_stored else _add_message(codes, refused)
        return AddOutcome(codes or [OK], state.term, durable, message, ids, refused)

    def _refuse_overwrites_at_or_below_lac(
        self, stream_id: int, lac: int, entries: list[Entry], codes: list[pb.Code]
    ) -> str:
        """Sets BAD_REQUEST in `codes` for the entries at or below `lac` that would replace an
        acknowledged entry with other bytes; returns the first reason ("": none)."""
        first = ""
        for i, e in enumerate(entries):
            if e.entry_id > lac or codes[i] != OK:
                continue
            try:
                stored = self._store.lookup(stream_id, e.entry_id)
            except StorageError as error:
                reason: str | None = f"entry {e.entry_id} cannot be compared: {error}"
            else:
                reason = overwrite_refusal(stored, e, lac)
            if reason is not None:
                codes[i] = BAD_REQUEST
                first = first or reason
        return first

    def _classify(
        self, stream_id: int, entries: list[Entry], special: list[int], codes: list[pb.Code]
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

    def _notify_lac(self, stream_id: int, lac: int) -> None:
        hook = self.on_lac_advanced
        if hook is None:
            return
        try:
            hook(stream_id, lac)
        except Exception:  # a broken hook must not fail the add
            log.exception("storage.lac_hook_failed", stream_id=stream_id)

    def store_copies(self, stream_id: int, entries: list[Entry]) -> int:
        """Stores entries that a repair copied from peers; returns how many were stored.

        Each entry the bookie does not hold yet, at or above the first retained entry and with
        a valid checksum, goes into the write cache as an add would, with two differences: it
        skips the journal (the repair flushes before it clears limbo, so a crash before that
        just repeats the repair), and a TRUNCATE flag deletes nothing (the copy is an old entry
        whose truncation this bookie already applied or never needed; entries above it may be
        newer and must stay). Raises `StorageError` when the storage is unusable."""
        store = self._store
        unusable = store.usable()
        if unusable is not None:
            raise StorageError(unusable, stream_id=stream_id)
        state = store.states.get(stream_id)
        if state is None or not entries:
            return 0
        stored = 0
        stored_bytes = 0
        # One index read for the batch. An entry flushed between it and the checks below was
        # added meanwhile with the same (committed) bytes: storing it again changes nothing.
        ids = [e.entry_id for e in entries]
        low, high = min(ids), max(ids)
        indexed = store.index.locations(stream_id, low, high, high - low + 1)
        with store.lock:
            cached = store.active.streams.get(stream_id)
            if cached is None:
                cached = store.active.streams[stream_id] = {}
            _, snap = store.cached(stream_id)
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
                cached[entry_id] = _serialize(e)
                stored += 1
                stored_bytes += len(e.payload) + ENTRY_OVERHEAD_BYTES
                if entry_id > state.last_entry_id:
                    state.last_entry_id = entry_id
            store.active.bytes += stored_bytes
            store.dirty.add(stream_id)
        if store.active.bytes >= self._flush_trigger_bytes:
            self._flusher.cache_full()
        return stored
