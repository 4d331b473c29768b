"""The read path: one entry (a recovery read applies the term rule first), ranges of entries
in batches (adjacent entry-log records read with one pread, optionally never parsed), and which
entries a BP-46 repair must copy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from stream.bookie.codes import (
    BAD_REQUEST,
    INTERNAL,
    NO_SUCH_STREAM,
    OK,
    TRIMMED,
    wire_code,
)
from stream.bookie.storage import codec
from stream.bookie.storage.entry_log import EntryLogGone
from stream.bookie.storage.locations import Run, index_runs
from stream.bookie.storage.outcomes import ReadResult
from stream.bookie.storage.rules import RequestRules, term_message
from stream.bookie.storage.state import LocalStreamState
from stream.bookie.storage.store import Store
from stream.bookie.unsafe import UnsafeSkips
from stream.errors import StorageError
from stream.framing.range_answer import FramedEntries
from stream.logs import get_logger
from stream.protocol.codes import Code, limbo_code
from stream.protocol.terms import TermDecision
from stream.wire import bookie_pb2 as pb

log = get_logger(__name__)

Entry = pb.Entry
# Bytes counted per entry beyond its payload (envelope estimate).
_ENTRY_OVERHEAD_BYTES = 32
_serialize_entry = Entry.SerializeToString
# Index locations fetched per LMDB transaction.
_RANGE_PREFETCH = 4096
_RECORD_HEADER_BYTES = codec.ENTRY_RECORD_HEADER_BYTES


def _uncached(n: int, active: dict[int, bytes], snap: dict[int, bytes], entry_id: int) -> int:
    """Returns how many of the `n` entries from `entry_id` on (whose index locations the read
    holds) come before the first the write caches hold (newer than its index location), at
    least one."""
    for cache in (active, snap):
        if cache and n > 1:
            held = next(filter(cache.__contains__, range(entry_id + 1, entry_id + n)), None)
            if held is not None:
                n = held - entry_id
    return n


class ReadPath:
    """Reads from one `Store`. `unsafe` turns the limbo rule off, in tests only
    (`stream.bookie.unsafe`)."""

    def __init__(self, store: Store, rules: RequestRules, unsafe: UnsafeSkips) -> None:
        self._store = store
        self._rules = rules
        self._batch_bytes = store.config.read_range_batch_bytes
        # Off only in the simulator's test that shows its checker catches a limbo bookie's
        # explicit negative (the lost entry a recovery would then truncate).
        self._limbo_unknown = "limbo_unknown" not in unsafe

    def read(self, stream_id: int, entry_id: int, term: int = 0) -> ReadResult:
        """Returns one entry. With `term` > 0 (a recovery read) the term rule applies first,
        and a new term is recorded durably, even for a stream never seen (the TLA+ spec fences
        on recovery reads). TRIMMED below the first retained entry, NO_SUCH_ENTRY when not
        held, NO_SUCH_STREAM for an unknown stream; in limbo an explicit negative becomes
        UNKNOWN."""
        store = self._store
        unusable = store.usable()
        if unusable is not None:
            return ReadResult(INTERNAL, None, -1, 0, 0, None, unusable)
        state = store.states.get(stream_id)
        durable = None
        if term:
            local_term = state.term if state is not None else 0
            decision = self._rules.decide(local_term, term)
            if not decision.serves:
                message = term_message(decision, term, local_term)
                code = wire_code(decision.code)
                if state is None:
                    return ReadResult(code, None, -1, 0, 0, None, message)
                return ReadResult(
                    code, None, state.lac, state.term, state.first_entry_id, None, message
                )
            with store.lock:
                if decision is TermDecision.ACCEPT_NEW:
                    state = store.apply_term(stream_id, term)
                    durable = store.journal.append(
                        codec.REC_TERM, codec.TERM_BODY.pack(stream_id, term)
                    )
                    store.term_recorded(stream_id, durable)
                else:
                    durable = store.unsynced_term(stream_id)
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
            entry = store.lookup(stream_id, entry_id)
        except StorageError as e:
            log.error("storage.read_failed", stream_id=stream_id, entry_id=entry_id, error=str(e))
            return ReadResult(
                INTERNAL, None, state.lac, state.term, state.first_entry_id, durable, str(e)
            )
        code = OK if entry is not None else self._negative(state)
        return ReadResult(code, entry, state.lac, state.term, state.first_entry_id, durable, "")

    def _negative(self, state: LocalStreamState) -> pb.Code:
        """Returns the answer for an entry the stream lacks: NO_SUCH_ENTRY, or UNKNOWN in
        limbo (the entry may be one the bookie lost)."""
        return wire_code(limbo_code(Code.NO_SUCH_ENTRY, state.limbo and self._limbo_unknown))

    def read_range(
        self, stream_id: int, first: int, last: int, max_batch_bytes: int = 0, *, raw: bool = False
    ) -> Iterator[tuple[pb.Code, list[Any] | FramedEntries]]:
        """Yields (code, entries) batches of [first, last] of at most about
        `max_batch_bytes` (0: read_range_batch_bytes). Stops at the first entry not held: the
        last batch carries the code of the stop (OK when the whole range was returned;
        NO_SUCH_ENTRY, UNKNOWN in limbo, TRIMMED, NO_SUCH_STREAM...). With `raw`, the entries
        of a batch come framed for a ReadRange answer (`FramedEntries`: the records as stored,
        never parsed), for a server that sends them as they are; without, parsed from that
        same framing (the simulator's bookies read through the server's path)."""
        max_bytes = max_batch_bytes if max_batch_bytes > 0 else self._batch_bytes
        batches = self._read_range(stream_id, first, last, max_bytes)
        if raw:
            return batches
        return ((code, framed.parsed()) for code, framed in batches)

    def _read_range(
        self, stream_id: int, first: int, last: int, max_bytes: int
    ) -> Iterator[tuple[pb.Code, FramedEntries]]:
        store = self._store
        unusable = store.usable()
        if unusable is not None:
            yield INTERNAL, FramedEntries()
            return
        if store.states.get(stream_id) is None:
            yield NO_SUCH_STREAM, FramedEntries()
            return
        if first < 0 or last < first:
            yield BAD_REQUEST, FramedEntries()
            return
        entry_id = first
        while True:
            state = store.states[stream_id]
            if entry_id < state.first_entry_id:
                yield TRIMMED, FramedEntries()
                return
            try:
                batch, entry_id, found_all = self._read_batch(stream_id, entry_id, last, max_bytes)
            except StorageError as e:
                log.error("storage.read_range_failed", stream_id=stream_id, error=str(e))
                yield INTERNAL, FramedEntries()
                return
            if not found_all:
                yield self._negative(state), batch
                return
            if entry_id > last:
                yield OK, batch
                return
            yield OK, batch

    def _read_batch(
        self, stream_id: int, entry_id: int, last: int, max_bytes: int
    ) -> tuple[FramedEntries, int, bool]:
        """Returns the entries from `entry_id` on (framed), the next entry id and whether no
        entry was missing, for one batch of at most `max_bytes` (at least one entry)."""
        active, snap = self._store.cached(stream_id)
        index = self._store.index
        batch = FramedEntries()
        size = 0
        located: list[bytes] = []  # index locations of ids located_first, located_first + 1...
        located_first = entry_id
        while entry_id <= last and (size < max_bytes or not batch):
            data = active.get(entry_id)
            if data is None:
                data = snap.get(entry_id)
            if data is not None:  # the caches hold entries serialized
                batch.append(data)
                size += len(data) + _ENTRY_OVERHEAD_BYTES
                entry_id += 1
                continue
            if entry_id - located_first >= len(located):
                count = min(last - entry_id + 1, _RANGE_PREFETCH)
                located = index.consecutive(stream_id, entry_id, count)
                located_first = entry_id
                if not located:
                    return batch, entry_id, False
            ahead = located[entry_id - located_first :]
            ahead = ahead[: _uncached(len(ahead), active, snap, entry_id)]
            count, runs = index_runs(ahead, max_bytes - size, _RECORD_HEADER_BYTES)
            added, added_bytes = self._read_located(stream_id, entry_id, runs, batch)
            size += added_bytes + _ENTRY_OVERHEAD_BYTES * added
            entry_id += added
            if added < count:
                return batch, entry_id, False
        return batch, entry_id, True

    def _read_located(
        self, stream_id: int, first_id: int, runs: list[Run], batch: FramedEntries
    ) -> tuple[int, int]:
        """Adds to `batch` the entries first_id, first_id + 1... located in `runs`, each run of
        adjacent records read with one pread; returns how many and the sum of their index
        lengths (fewer than the runs hold when some were deleted meanwhile)."""
        added = added_bytes = 0
        for log_id, base, offsets, lengths in runs:
            try:
                span = self._store.logs.read_span(log_id, base, offsets[-1] + lengths[-1] - base)
            except EntryLogGone:
                # Compaction moved these entries meanwhile: look each one up again.
                for length in lengths:
                    entry = self._store.lookup(stream_id, first_id + added)
                    if entry is None:
                        return added, added_bytes  # deleted meanwhile: the range stops here
                    batch.append(_serialize_entry(entry))
                    added += 1
                    added_bytes += length
                continue
            # One compiled step frames every span of the answer: no bytes object per entry.
            batch.add_span(span, base, offsets, lengths)
            added += len(offsets)
            added_bytes += sum(lengths)
        return added, added_bytes

    def missing_entry_ids(self, stream_id: int, entry_ids: list[int]) -> list[int]:
        """Returns those of `entry_ids` (ascending) that the bookie does not hold, looking at
        the write caches and the index only (no entry data is read): what a repair must copy.
        An id below the stream's first retained entry is never missing."""
        if not entry_ids:
            return []
        store = self._store
        state = store.states.get(stream_id)
        first_retained = state.first_entry_id if state is not None else 0
        # Same order as `Store.lookup`: active cache, snapshot, then index (the flusher moves
        # entries active -> snapshot -> index, and drops the snapshot only after the index
        # commit).
        active, snap = store.cached(stream_id)
        missing: list[int] = []
        for start in range(0, len(entry_ids), _RANGE_PREFETCH):
            chunk = entry_ids[start : start + _RANGE_PREFETCH]
            span = chunk[-1] - chunk[0] + 1
            located = store.index.locations(stream_id, chunk[0], chunk[-1], span)
            for entry_id in chunk:
                if (
                    entry_id >= first_retained
                    and entry_id not in active
                    and entry_id not in snap
                    and entry_id not in located
                ):
                    missing.append(entry_id)
        return missing
