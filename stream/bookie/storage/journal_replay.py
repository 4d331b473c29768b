"""Journal replay at open: the records after the index's checkpoint applied in order, entries
back into the write cache and term, truncate, trim and limbo changes to the stream states;
flushed part by part when the journal holds more than the cache should."""

from __future__ import annotations

from stream.bookie.codes import FLAG_TRUNCATE
from stream.bookie.storage import codec
from stream.bookie.storage.flusher import Flusher
from stream.bookie.storage.journal import JournalPosition, replay
from stream.bookie.storage.outcomes import ReplayReport
from stream.bookie.storage.store import Store
from stream.bookie.storage.write_cache import ENTRY_OVERHEAD_BYTES
from stream.errors import StorageError
from stream.logs import get_logger
from stream.wire import bookie_pb2 as pb

# The write cache holds entries serialized (`stream.bookie.storage.write_cache`).
_serialize = pb.Entry.SerializeToString

log = get_logger(__name__)


def replay_journal(
    store: Store, flusher: Flusher, checkpoint: JournalPosition, unclean: bool
) -> ReplayReport:
    """Applies the journal's records after `checkpoint` to `store`; returns what it found
    (`unclean`: the unclean-shutdown bit was set)."""
    records = 0
    entries = 0
    for record in replay(store.config.journal_path, checkpoint, store.disk):
        records += 1
        with store.lock:
            entries += _replay_record(store, record.type, record.payload)
        if store.active.bytes >= flusher.trigger_bytes:
            # The journal holds more than the cache should: flush part of it now, with a
            # checkpoint right after the record just applied.
            flusher.flush_all(checkpoint=record.position)
    if records:
        log.info("storage.replayed", records=records, entries=entries, checkpoint=checkpoint)
    return ReplayReport(records, entries, unclean)


def _replay_record(store: Store, record_type: int, payload: bytes) -> int:
    """Applies one journal record; returns the entries it put back into the cache."""
    if record_type == codec.REC_ADD:
        return _replay_add(store, pb.AddRequest.FromString(payload))
    if record_type == codec.REC_TERM:
        stream_id, term = codec.TERM_BODY.unpack(payload)
        store.apply_term(stream_id, term)
    elif record_type == codec.REC_TRUNCATE:
        stream_id, term, after_entry_id = codec.TRUNCATE_BODY.unpack(payload)
        store.apply_truncate(stream_id, term, after_entry_id)
    elif record_type == codec.REC_TRIM:
        stream_id, before_entry_id = codec.TRIM_BODY.unpack(payload)
        store.apply_trim(stream_id, before_entry_id)
    elif record_type == codec.REC_LIMBO:
        stream_id, limbo, term = codec.LIMBO_BODY.unpack(payload)
        store.apply_limbo(stream_id, bool(limbo), term)
    else:
        raise StorageError("unknown journal record type", type=record_type)
    return 0


def _replay_add(store: Store, request: pb.AddRequest) -> int:
    stream_id = request.stream_id
    state = store.apply_term(stream_id, request.term)
    entries = list(request.entries)
    if state.first_entry_id > 0:
        entries = [e for e in entries if e.entry_id >= state.first_entry_id]
    if entries:
        ids = [e.entry_id for e in entries]
        truncate_at = [i for i, e in enumerate(entries) if e.flags & FLAG_TRUNCATE]
        store.put_entries(stream_id, state, ids, list(map(_serialize, entries)), truncate_at)
        store.active.bytes += sum(len(e.payload) for e in entries)
        store.active.bytes += ENTRY_OVERHEAD_BYTES * len(entries)
    if request.lac > state.lac:
        state.lac = request.lac
    if request.lafr > state.lafr:
        state.lafr = request.lafr
    return len(entries)
