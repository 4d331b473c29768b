"""Entry logs: the files that hold flushed entries, `entrylog-<id:08x>.log`, rotated at
`entry_log_size_limit_bytes`. A record is `[u32 len][u64 stream_id][Entry serialized]`; the
LMDB index locates the serialized Entry of each (stream, entry).

Writers (the flusher and compaction) hold `lock` while they append; a new log is started on
every open and logs are never appended to after rotation, so a log below
`immutable_below()` only ever loses live entries, which is what makes GC safe.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from stream.bookie import metrics
from stream.bookie.storage.codec import (
    ENTRY_KEY,
    ENTRY_LOG_FILE_HEADER,
    ENTRY_LOG_MAGIC,
    ENTRY_RECORD_HEADER,
    ENTRY_RECORD_HEADER_BYTES,
    LOCATION,
    entry_log_file_name,
    parse_numbered_name,
)
from stream.bookie.storage.disk_port import OS_DISK, DiskPort
from stream.errors import StorageError
from stream.framing import native
from stream.logs import get_logger
from stream.protocol.invariant import invariant
from stream.wire import bookie_pb2 as pb

log = get_logger(__name__)

Entry = pb.Entry
_parse = pb.Entry.FromString
_pack_key = ENTRY_KEY.pack
_pack_location = LOCATION.pack
_unpack_location = LOCATION.unpack
_pack_record_header = ENTRY_RECORD_HEADER.pack
_FILE_HEADER_BYTES = ENTRY_LOG_FILE_HEADER.size
_IOV_MAX = 1024
# Buffered bytes that trigger a write during a flush: large writes, bounded memory.
_WRITE_CHUNK_BYTES = 8 << 20
# Entries per C-level map call in a flush (about a millisecond of work each).
_SLICE_ENTRIES = 1024
# Read descriptors kept open (least recently opened closed first beyond it).
_MAX_READ_FDS = 256
_ENTRYLOG_BYTES = metrics.BYTES_WRITTEN.labels(kind="entrylog")
_COMPACTION_BYTES = metrics.BYTES_WRITTEN.labels(kind="compaction")


def log_records_python(
    stream_id: int, entry_ids: Sequence[int], datas: Sequence[bytes], log_id: int, offset: int
) -> tuple[list[bytes], list[bytes], bytes]:
    """Returns (index keys, index locations, records) for appending `datas` (the serialized
    entries `entry_ids` of stream `stream_id`) to log `log_id` from byte `offset`: `records`
    holds each entry's record (header, then its bytes) end to end. The definition the
    compiled `log_records` (stream.framing.native) is held to, and what a flush does without
    it (tests/unit/bookie/test_log_records.py)."""
    if len(entry_ids) != len(datas):
        raise ValueError("entry_ids and datas differ in length")
    lengths = list(map(len, datas))
    starts = itertools.accumulate(
        map(operator.add, lengths, itertools.repeat(ENTRY_RECORD_HEADER_BYTES)),
        initial=offset + ENTRY_RECORD_HEADER_BYTES,
    )
    keys = list(map(_pack_key, itertools.repeat(stream_id), entry_ids))
    locations = list(map(_pack_location, itertools.repeat(log_id), starts, lengths))
    headers = map(_pack_record_header, lengths, itertools.repeat(stream_id))
    records = b"".join(itertools.chain.from_iterable(zip(headers, datas, strict=True)))
    return keys, locations, records


# A flush's per-entry work in one compiled call per slice: the records joined for one write,
# the keys and locations packed, no Python step and no iovec per entry.
_log_records = native.log_records if native.BUILT else log_records_python


class EntryLogGone(StorageError):
    """An entry log named by a location no longer exists (GC or compaction removed it after
    the location was read): look the entry up again."""


class EntryLogs:
    """The entry-log files of one ledger directory."""

    def __init__(self, path: Path, *, size_limit_bytes: int, disk: DiskPort = OS_DISK) -> None:
        self._path = path
        self._disk = disk
        self._size_limit = size_limit_bytes
        self.lock = threading.Lock()  # held by whoever appends (flusher, compaction)
        self._fd_lock = threading.Lock()  # guards _read_fds (readers, deletion)
        self._read_fds: dict[int, int] = {}
        self._current_id = 1
        self._write_fd = -1
        self._write_offset = 0
        self._unsynced_fds: list[int] = []  # rotated away, written, not yet synced
        self._flush_start_id: int | None = None
        self.bytes_written = 0

    # -- lifecycle ------------------------------------------------------------------------

    def open(self) -> None:
        """Finds the existing logs; the next write starts a new log numbered after them."""
        existing = self.log_ids()
        self._current_id = (existing[-1] + 1) if existing else 1
        metrics.ENTRY_LOGS.set(len(existing))

    def close(self) -> None:
        """Syncs what was written and closes every descriptor."""
        with self.lock:
            self.sync()
            if self._write_fd >= 0:
                self._disk.close(self._write_fd)
                self._write_fd = -1
        self._close_read_fds()

    def abandon(self) -> None:
        """Closes every descriptor without syncing (a simulated crash)."""
        for fd in [self._write_fd, *self._unsynced_fds]:
            if fd >= 0:
                self._disk.close(fd)
        self._write_fd = -1
        self._unsynced_fds = []
        self._close_read_fds()

    def _close_read_fds(self) -> None:
        with self._fd_lock:
            for fd in self._read_fds.values():
                self._disk.close(fd)
            self._read_fds.clear()

    def log_ids(self) -> list[int]:
        """Returns the ids of the entry-log files on disk, ascending."""
        ids = []
        for name in self._disk.listdir(self._path):
            log_id = parse_numbered_name(name, "entrylog-", 8)
            if log_id is not None:
                ids.append(log_id)
        ids.sort()
        return ids

    def log_sizes(self) -> dict[int, int]:
        """Returns the size in bytes of every entry-log file (without its file header)."""
        sizes = {}
        for log_id in self.log_ids():
            with contextlib.suppress(FileNotFoundError):
                size = self._disk.size(self._path / entry_log_file_name(log_id))
                sizes[log_id] = max(size - _FILE_HEADER_BYTES, 0)
        return sizes

    def disk_bytes(self) -> int:
        """Returns the total size of the entry-log files."""
        return sum(self.log_sizes().values()) + _FILE_HEADER_BYTES * len(self.log_ids())

    def immutable_below(self) -> int:
        """Returns the id below which logs get no new locations in the index: below the
        current log and below the first log of a flush whose index commit is pending."""
        start = self._flush_start_id
        return min(self._current_id, start) if start is not None else self._current_id

    def begin_flush(self) -> None:
        """Marks a flush in progress from the current log on (GC leaves those logs alone
        until `end_flush`). Call holding `lock`."""
        self._flush_start_id = self._current_id

    def end_flush(self) -> None:
        """Ends the mark of `begin_flush` (after the flush's index commit)."""
        self._flush_start_id = None

    # -- writing (holding `lock`) -----------------------------------------------------------

    def write_entries(
        self, streams: Sequence[tuple[int, Sequence[int], Sequence[bytes]]]
    ) -> tuple[list[bytes], list[bytes], int]:
        """Appends the entries of `streams` ((stream_id, entry ids ascending, entries
        serialized, as the write cache holds them)) and returns (index keys, index locations,
        bytes written) in the same order. Not synced: call `sync()`. The work is done by
        `log_records` over slices of a stream; only a slice that crosses a log rotation goes
        entry by entry."""
        keys: list[bytes] = []
        locations: list[bytes] = []
        buffers: list[bytes] = []
        buffered = 0
        written = 0
        record_header = ENTRY_RECORD_HEADER_BYTES
        for stream_id, all_ids, all_entries in streams:
            # Slices keep each compiled call short: a long one would hold the GIL and stall
            # the event loop for its whole length.
            for start in range(0, len(all_ids), _SLICE_ENTRIES):
                entry_ids = all_ids[start : start + _SLICE_ENTRIES]
                datas = all_entries[start : start + _SLICE_ENTRIES]
                self._ensure_file()
                slice_keys, slice_locations, records = _log_records(
                    stream_id, entry_ids, datas, self._current_id, self._write_offset
                )
                total = len(records)
                # A slice that would cross the size limit (once per log) goes entry by entry.
                if self._write_offset + total <= self._size_limit:
                    keys += slice_keys
                    locations += slice_locations
                    buffers.append(records)
                    self._write_offset += total
                    buffered += total
                else:
                    for entry_id, data in zip(entry_ids, datas, strict=True):
                        length = len(data)
                        if self._write_offset + record_header + length > self._size_limit:
                            written += self._write_out(buffers)
                            buffers, buffered = [], 0
                            self._rotate()
                            self._ensure_file()
                        keys.append(_pack_key(stream_id, entry_id))
                        locations.append(
                            _pack_location(
                                self._current_id, self._write_offset + record_header, length
                            )
                        )
                        buffers.append(_pack_record_header(length, stream_id))
                        buffers.append(data)
                        self._write_offset += record_header + length
                        buffered += record_header + length
                if buffered >= _WRITE_CHUNK_BYTES:
                    written += self._write_out(buffers)
                    buffers, buffered = [], 0
                    # Sync as we go: one big fdatasync at the end floods the device queue
                    # and every journal commit waits behind it (measured: journal
                    # throughput beside a concurrent 96 MB flush 640 -> 910 MB/s).
                    self._disk.fdatasync(self._write_fd)
        written += self._write_out(buffers)
        self.bytes_written += written
        _ENTRYLOG_BYTES.inc(written)
        return keys, locations, written

    def append_records(self, records: Iterable[tuple[int, bytes]]) -> list[bytes]:
        """Appends whole records (stream_id, serialized Entry) for compaction; returns the
        new location of each, in order. Not synced: call `sync()`."""
        locations: list[bytes] = []
        buffers: list[bytes] = []
        written = 0
        record_header = ENTRY_RECORD_HEADER_BYTES
        for stream_id, data in records:
            self._ensure_file()
            length = len(data)
            if self._write_offset + record_header + length > self._size_limit:
                written += self._write_out(buffers)
                buffers = []
                self._rotate()
                self._ensure_file()
            locations.append(
                _pack_location(self._current_id, self._write_offset + record_header, length)
            )
            buffers.append(_pack_record_header(length, stream_id))
            buffers.append(data)
            self._write_offset += record_header + length
        written += self._write_out(buffers)
        self.bytes_written += written
        _COMPACTION_BYTES.inc(written)
        return locations

    def sync(self) -> None:
        """Makes everything written so far durable (fdatasync of every log written)."""
        disk = self._disk
        for fd in self._unsynced_fds:
            disk.fdatasync(fd)
            disk.close(fd)
        self._unsynced_fds = []
        if self._write_fd >= 0:
            disk.fdatasync(self._write_fd)

    def _ensure_file(self) -> None:
        if self._write_fd >= 0:
            return
        path = self._path / entry_log_file_name(self._current_id)
        disk = self._disk
        fd = disk.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        header = ENTRY_LOG_FILE_HEADER.pack(ENTRY_LOG_MAGIC, self._current_id)
        disk.write(fd, header)
        # The new name must survive a crash before the index points into the file.
        disk.fsync_dir(self._path)
        self._write_fd = fd
        self._write_offset = len(header)
        metrics.ENTRY_LOGS.inc()
        log.debug("entrylog.created", log_id=self._current_id)

    def _rotate(self) -> None:
        if self._write_fd >= 0:
            self._unsynced_fds.append(self._write_fd)
        self._write_fd = -1
        self._current_id += 1

    def _write_out(self, buffers: list[bytes]) -> int:
        """Writes `buffers` at the end of the current log (already counted in
        _write_offset); returns the byte count."""
        if not buffers:
            return 0
        total = sum(map(len, buffers))
        position = self._write_offset - total
        fd = self._write_fd
        disk = self._disk
        for start in range(0, len(buffers), _IOV_MAX):
            chunk = buffers[start : start + _IOV_MAX]
            size = sum(map(len, chunk))
            n = disk.pwritev(fd, chunk, position)
            if n != size:  # short write (rare): finish it in one piece
                rest = b"".join(chunk)[n:]
                while rest:
                    k = disk.pwrite(fd, rest, position + n)
                    rest, n = rest[k:], n + k
            position += size
        invariant(position == self._write_offset, "entry log write ends at its offset")
        return total

    # -- reading (any thread) ---------------------------------------------------------------

    def read_entry(self, location: bytes) -> Entry:
        """Returns the entry at `location` (an index value); raises `EntryLogGone` when its
        log was deleted meanwhile and `StorageError` when the log is damaged."""
        log_id, offset, length = _unpack_location(location)
        data = self._pread(log_id, offset, length)
        try:
            return _parse(data)
        except Exception as e:  # DecodeError: bytes on disk are not an entry
            raise StorageError("unreadable entry in entry log", log_id=log_id, offset=offset) from e

    def read_span(self, log_id: int, offset: int, length: int) -> bytes:
        """Returns `length` bytes of log `log_id` from `offset` (several adjacent entries)."""
        return self._pread(log_id, offset, length)

    def _pread(self, log_id: int, offset: int, length: int) -> bytes:
        with self._fd_lock:
            fd = self._read_fds.get(log_id)
            if fd is None:
                try:
                    fd = self._disk.open(self._path / entry_log_file_name(log_id), os.O_RDONLY)
                except FileNotFoundError:
                    raise EntryLogGone("entry log is gone", log_id=log_id) from None
                if len(self._read_fds) >= _MAX_READ_FDS:
                    self._disk.close(self._read_fds.pop(next(iter(self._read_fds))))
                self._read_fds[log_id] = fd
            data = self._disk.pread(fd, length, offset)
        if len(data) != length:
            raise StorageError(
                "entry log shorter than its index says",
                log_id=log_id,
                offset=offset,
                length=length,
                got=len(data),
            )
        return data

    # -- deletion (GC thread) ---------------------------------------------------------------

    def delete(self, log_id: int) -> int:
        """Deletes log `log_id` (it must be immutable); returns the bytes freed."""
        invariant(
            log_id < self.immutable_below(),
            "only an immutable entry log may be deleted",
            log_id=log_id,
            immutable_below=self.immutable_below(),
        )
        with self._fd_lock:
            fd = self._read_fds.pop(log_id, None)
            if fd is not None:
                self._disk.close(fd)
        path = self._path / entry_log_file_name(log_id)
        try:
            size = self._disk.size(path)
            self._disk.unlink(path)
        except FileNotFoundError:
            return 0
        metrics.ENTRY_LOGS.dec()
        log.info("entrylog.deleted", log_id=log_id, bytes=size)
        return size
