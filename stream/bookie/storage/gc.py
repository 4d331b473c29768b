"""Garbage collection and compaction of entry logs.

GC drops trimmed entries from the index, counts the live bytes of every entry log from the
index and deletes the immutable logs without a live entry. Compaction rewrites the live
entries of sparse logs (live ratio below a threshold) into the current log, repoints their
index locations (only where they still point at the old place: a concurrent overwrite,
truncate or trim wins), syncs, then deletes the old log.

Safety rests on `EntryLogs.immutable_below()`: no new location ever points into a log below
it, so a log found without live entries stays so.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from stream.bookie import metrics
from stream.bookie.storage.codec import (
    ENTRY_KEY,
    ENTRY_RECORD_HEADER_BYTES,
    LOCATION,
)
from stream.bookie.storage.entry_log import EntryLogs
from stream.bookie.storage.index import Index
from stream.logs import get_logger

log = get_logger(__name__)

# Index entries per scan transaction / per trimming transaction.
_SCAN_CHUNK = 65_536
_TRIM_CHUNK = 10_000
# Compaction moves at most this many bytes per write/sync/index round.
_COMPACTION_CHUNK_BYTES = 32 << 20
_LOG_ID = LOCATION.unpack_from  # first field of a location is its log id


@dataclass(frozen=True)
class GcReport:
    """What one GC round did."""

    deleted_logs: int
    freed_bytes: int
    trimmed_entries: int


@dataclass(frozen=True)
class CompactionReport:
    """What one compaction round did (deleted_logs counts logs found empty on the way)."""

    compacted_logs: int
    moved_entries: int
    written_bytes: int
    freed_bytes: int
    deleted_logs: int


class GarbageCollector:
    """GC and compaction over one index and one set of entry logs."""

    def __init__(self, index: Index, logs: EntryLogs, index_lock: threading.Lock) -> None:
        self._index = index
        self._logs = logs
        self._index_lock = index_lock
        self._lock = threading.Lock()  # one GC or compaction round at a time
        self._stopping = threading.Event()

    def stop(self) -> None:
        """Makes a running round end early (between steps)."""
        self._stopping.set()

    def gc_once(self, trim_points: dict[int, int]) -> GcReport:
        """Runs one GC round; `trim_points` maps stream ids to their first retained entry."""
        with self._lock:
            trimmed = self._drop_trimmed(trim_points)
            limit = self._immutable_below()
            live = self._live_bytes()
            deleted, freed = self._delete_dead(limit, live)
        if deleted or trimmed:
            log.info("gc.done", deleted_logs=deleted, freed_bytes=freed, trimmed=trimmed)
        return GcReport(deleted, freed, trimmed)

    def compact_once(
        self, threshold: float, trim_points: dict[int, int], *, kind: str = "manual"
    ) -> CompactionReport:
        """Runs one compaction round over the immutable logs whose live ratio is below
        `threshold` (<= 0: nothing)."""
        if threshold <= 0:
            return CompactionReport(0, 0, 0, 0, 0)
        with self._lock:
            self._drop_trimmed(trim_points)
            limit = self._immutable_below()
            sizes = self._logs.log_sizes()
            live = self._live_bytes()
            deleted, freed = self._delete_dead(limit, live)
            candidates = {
                log_id
                for log_id, size in sizes.items()
                if log_id < limit and size > 0 and 0 < live.get(log_id, 0) < threshold * size
            }
            if not candidates or self._stopping.is_set():
                return CompactionReport(0, 0, 0, freed, deleted)
            by_log = self._locations_in(candidates)
            compacted = moved = written = 0
            for log_id in sorted(candidates):
                if self._stopping.is_set():
                    break
                log_moved, log_written = self._compact_log(log_id, by_log.get(log_id, []))
                freed += self._logs.delete(log_id)
                compacted += 1
                moved += log_moved
                written += log_written
        metrics.COMPACTED_LOGS.labels(kind=kind).inc(compacted)
        log.info(
            "compaction.done",
            kind=kind,
            threshold=threshold,
            compacted_logs=compacted,
            moved_entries=moved,
            written_bytes=written,
            freed_bytes=freed,
        )
        return CompactionReport(compacted, moved, written, freed, deleted)

    # -- steps ----------------------------------------------------------------------------

    def _immutable_below(self) -> int:
        with self._logs.lock:
            return self._logs.immutable_below()

    def _drop_trimmed(self, trim_points: dict[int, int]) -> int:
        """Deletes index entries below each stream's first retained entry; returns how many."""
        dropped = 0
        for stream_id, first in trim_points.items():
            while not self._stopping.is_set():
                if self._index.first_entry_id(stream_id) not in range(0, first):
                    break
                with self._index_lock:
                    n = self._index.delete_range(stream_id, 0, first - 1, limit=_TRIM_CHUNK)
                dropped += n
                if n < _TRIM_CHUNK:
                    break
        # Deletions that make a log dead must be durable before the log is deleted.
        self._index.sync()
        return dropped

    def _live_bytes(self) -> dict[int, int]:
        """Returns the live bytes (records of entries in the index) of every entry log."""
        live: dict[int, int] = {}
        header = ENTRY_RECORD_HEADER_BYTES
        for batch in self._index.scan(_SCAN_CHUNK):
            joined = b"".join([location for _, location in batch])
            for log_id, _, length in LOCATION.iter_unpack(joined):
                live[log_id] = live.get(log_id, 0) + length + header
        return live

    def _delete_dead(self, limit: int, live: dict[int, int]) -> tuple[int, int]:
        deleted = freed = 0
        for log_id in self._logs.log_ids():
            if log_id >= limit:
                break
            if live.get(log_id, 0) == 0:
                freed += self._logs.delete(log_id)
                deleted += 1
        if deleted:
            metrics.GC_DELETED_LOGS.inc(deleted)
        return deleted, freed

    def _locations_in(self, log_ids: set[int]) -> dict[int, list[tuple[bytes, bytes]]]:
        """Returns {log_id: [(key, location)]} for the index entries that point into
        `log_ids`."""
        found: dict[int, list[tuple[bytes, bytes]]] = {log_id: [] for log_id in log_ids}
        for batch in self._index.scan(_SCAN_CHUNK):
            for key, location in batch:
                bucket = found.get(_LOG_ID(location)[0])
                if bucket is not None:
                    bucket.append((key, location))
        return found

    def _compact_log(self, log_id: int, items: list[tuple[bytes, bytes]]) -> tuple[int, int]:
        """Moves the live entries `items` of log `log_id` into the current log; returns
        (entries moved, bytes written)."""
        parsed = sorted(
            ((LOCATION.unpack(location), key, location) for key, location in items),
            key=lambda item: item[0][1],
        )
        moved = written = 0
        start = 0
        while start < len(parsed):
            end = start
            size = 0
            while end < len(parsed) and (size < _COMPACTION_CHUNK_BYTES or end == start):
                size += parsed[end][0][2] + ENTRY_RECORD_HEADER_BYTES
                end += 1
            chunk = parsed[start:end]
            records = self._read_records(log_id, chunk)
            with self._logs.lock:
                new_locations = self._logs.append_records(records)
                self._logs.sync()
            written += sum(len(data) + ENTRY_RECORD_HEADER_BYTES for _, data in records)
            moves = [
                (key, old, new) for (_, key, old), new in zip(chunk, new_locations, strict=True)
            ]
            with self._index_lock:
                moved += self._index.move_locations(moves)
            start = end
        # The new locations must be durable before the old log goes.
        self._index.sync()
        return moved, written

    def _read_records(
        self, log_id: int, chunk: list[tuple[tuple[int, int, int], bytes, bytes]]
    ) -> list[tuple[int, bytes]]:
        """Returns (stream_id, serialized entry) for `chunk` (sorted by offset), reading
        adjacent records with one pread."""
        records: list[tuple[int, bytes]] = []
        header = ENTRY_RECORD_HEADER_BYTES
        i = 0
        while i < len(chunk):
            (_, offset, length), _, _ = chunk[i]
            j = i + 1
            end = offset + length
            while j < len(chunk) and chunk[j][0][1] == end + header:
                end = chunk[j][0][1] + chunk[j][0][2]
                j += 1
            span = memoryview(self._logs.read_span(log_id, offset, end - offset))
            for (_, entry_offset, entry_length), key, _ in chunk[i:j]:
                stream_id = ENTRY_KEY.unpack(key)[0]
                start = entry_offset - offset
                records.append((stream_id, bytes(span[start : start + entry_length])))
            i = j
        return records
