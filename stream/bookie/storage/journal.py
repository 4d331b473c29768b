"""The write-ahead journal: append-only files with group commit (one write and one fdatasync
for everything pending), and its replay after a restart.

Appends come from one thread (the event loop) and return a `concurrent.futures.Future` shared
by every record of the same group; the committer completes it after the fdatasync that covers
those records: the journal thread, or, started without it, whoever calls `commit_pending()`
(the event loop, `stream.bookie.storage.loop_commits`; a simulator). The futures are marked
running at creation, so a waiter that cancels its wrapper cannot cancel the shared future
under the other waiters.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from stream.bookie import metrics
from stream.bookie.storage.codec import (
    JOURNAL_BLOCK,
    JOURNAL_FILE_HEADER,
    JOURNAL_MAGIC,
    JOURNAL_MAGIC_V1,
    JOURNAL_MAGIC_V2,
    JOURNAL_RECORD_HEADER,
    JOURNAL_RECORD_PREFIX,
    JOURNAL_SEED,
    REC_PAD,
    RECORD_TYPES,
    journal_file_name,
    parse_numbered_name,
    recycled_journal_name,
)
from stream.bookie.storage.disk_port import OS_DISK, DiskPort
from stream.bookie.storage.journal_blocks import MARK, Blocks
from stream.errors import StorageError
from stream.framing import native
from stream.logs import get_logger
from stream.protocol.invariant import invariant

log = get_logger(__name__)

_crc32c = native.crc32c
# Journal files behind the checkpoint kept for reuse. Deleting a journal file of hundreds
# of MiB frees all its extents at once; on ext4 (worse with online discard) the next
# fdatasync then waits for that, and appends stalled for 100-500 ms at every deletion
# (measured: 15,000 1 KiB appends/s, e3w3a2, p99 85-350 ms with deletion, 35 ms without).
# A reused file is also overwritten in place: no block allocation under the fdatasync.
_SPARE_FILES = 2

# A group grows (up to journal_max_group_wait_ms) only while it is below this size: a large
# group is already worth its fdatasync.
_GROUP_GROW_BYTES = 1 << 20
_JOURNAL_BYTES = metrics.BYTES_WRITTEN.labels(kind="journal")


class JournalPosition(NamedTuple):
    """A place in the journal: file sequence number and byte offset in that file."""

    seq: int
    offset: int


@dataclass(frozen=True)
class _WrittenGroup:
    """A group commit whose records are written but not yet synced: what its fdatasync
    completes (the group's future, and the checkpoint marks at their positions)."""

    items: list[tuple[int, object]]
    future: Future[None]
    marks: list[tuple[Future[JournalPosition], JournalPosition]]
    size: int
    records: int
    started: float


@dataclass(frozen=True)
class ReplayedRecord:
    """One valid journal record found by replay; `position` is where the next record starts."""

    type: int
    payload: bytes
    position: JournalPosition


def _running_future() -> Future[None]:
    """Returns a new future already marked running, so that nobody can cancel it."""
    fut: Future[None] = Future()
    fut.set_running_or_notify_cancel()
    return fut


def journal_seed(seq: int) -> int:
    """Returns the crc32c value that the crcs of journal file `seq`'s records continue from
    (version 2 files)."""
    return _crc32c(JOURNAL_SEED.pack(seq))


def _type_crcs(seed: int) -> dict[int, int]:
    """Returns, per record type (padding too), the crc of the body's type byte continued from
    `seed`, so that a record's crc is computed over its payload alone (no concatenation of
    type byte and payload)."""
    return {t: _crc32c(bytes([t]), seed) for t in (*RECORD_TYPES, REC_PAD)}


def journal_files(path: Path, disk: DiskPort = OS_DISK) -> list[tuple[int, Path]]:
    """Returns the journal files under `path` as (seq, path), oldest first."""
    found = []
    for name in disk.listdir(path):
        seq = parse_numbered_name(name, "journal-", 16)
        if seq is not None:
            found.append((seq, path / name))
    found.sort()
    return found


def replay(
    path: Path, checkpoint: JournalPosition, disk: DiskPort = OS_DISK
) -> Iterator[ReplayedRecord]:
    """Yields every valid record at or after `checkpoint`, oldest first.

    A torn or corrupt record ends the replay of the last file (the crash interrupted that
    write; its group was never acknowledged) and the file is cut there, so that it is clean
    once newer files follow it. The same damage in an older file is a `StorageError`."""
    files = [(seq, p) for seq, p in journal_files(path, disk) if seq >= checkpoint.seq]
    for index, (seq, file_path) in enumerate(files):
        last = index == len(files) - 1
        start = checkpoint.offset if seq == checkpoint.seq else JOURNAL_FILE_HEADER.size
        yield from _replay_file(disk, seq, file_path, start, last=last)


def _replay_file(
    disk: DiskPort, seq: int, path: Path, start: int, *, last: bool
) -> Iterator[ReplayedRecord]:
    size = disk.size(path)
    header_size = JOURNAL_FILE_HEADER.size
    if size < header_size:
        _headerless(disk, path, size, last=last)
        return
    with disk.mapped(path) as data:
        if not any(data[:header_size]):
            _headerless(disk, path, size, last=last)
            return
        magic, file_seq = JOURNAL_FILE_HEADER.unpack_from(data, 0)
        if magic not in (JOURNAL_MAGIC, JOURNAL_MAGIC_V2, JOURNAL_MAGIC_V1) or file_seq != seq:
            raise StorageError("not a journal file", path=str(path), seq=seq, file_seq=file_seq)
        seed = journal_seed(seq) if magic != JOURNAL_MAGIC_V1 else 0
        padded = magic == JOURNAL_MAGIC
        if start > size:
            raise StorageError("journal checkpoint beyond end of file", path=str(path))
        offset = max(start, JOURNAL_BLOCK if padded else header_size)
        problem = None
        unpack_header = JOURNAL_RECORD_HEADER.unpack_from
        header_bytes = JOURNAL_RECORD_HEADER.size
        while offset < size:
            if offset + header_bytes > size:
                problem = "torn record header"
                break
            body_len, crc = unpack_header(data, offset)
            if body_len == 0:
                if crc != 0:
                    problem = "zero-length record"
                break  # else: zeros, the end of written data
            body_start = offset + header_bytes
            body_end = body_start + body_len
            if body_end > size:
                problem = "record runs past end of file"
                break
            body = data[body_start:body_end]
            if _crc32c(body, seed) != crc:
                problem = "record checksum mismatch"
                break
            if body[0] not in RECORD_TYPES:
                if padded and body[0] == REC_PAD:
                    offset = body_end
                    continue
                problem = "unknown record type"
                break
            yield ReplayedRecord(body[0], body[1:], JournalPosition(seq, body_end))
            offset = body_end
    if problem is not None and not last:
        raise StorageError(f"corrupt journal: {problem}", path=str(path), offset=offset)
    if last and size > offset:
        if problem is not None:
            log.warning("journal.torn_tail", path=str(path), offset=offset, problem=problem)
        # Cut the tail (a torn record, zeros, or a reused file's earlier records) so that
        # this file reads clean once a newer file follows it.
        fd = disk.open(path, os.O_WRONLY)
        try:
            _cut(disk, fd, offset)
        finally:
            disk.close(fd)


def _cut(disk: DiskPort, fd: int, size: int) -> None:
    """Cuts the file at `size` bytes, durably (a file that a newer one follows must end at
    its last record)."""
    if disk.fsize(fd) > size:
        disk.ftruncate(fd, size)
        disk.fsync(fd)


def _headerless(disk: DiskPort, path: Path, size: int, *, last: bool) -> None:
    """Handles a journal file without a header: a crash between creating the file and
    syncing its header left it holding nothing."""
    if not last:
        raise StorageError("journal file without a header", path=str(path))
    log.warning("journal.headerless_file_removed", path=str(path), size=size)
    disk.unlink(path)


class Journal:
    """The journal writer: a thread that group-commits appended records, or, started without
    it, `commit_pending()` called by the event loop between its turns (`LoopCommits`) or by a
    simulator when its virtual clock says so. `clock` is the monotonic clock in seconds."""

    def __init__(
        self,
        path: Path,
        *,
        max_file_bytes: int,
        max_group_wait_ms: float,
        disk: DiskPort = OS_DISK,
        clock: Callable[[], float] = time.monotonic,
        on_group: Callable[[], None] | None = None,
        ack_before_sync: bool = False,
    ) -> None:
        """`on_group` (settable later) is called on the appending thread when a new group
        starts: a caller running the journal without its thread schedules `commit_pending`.
        `ack_before_sync` completes a group's future once it is written, before its fdatasync:
        a broken rule, for the tests that show the simulator catches it (never in
        production)."""
        self._path = path
        self._ack_before_sync = ack_before_sync
        self.on_group = on_group
        self._disk = disk
        self._clock = clock
        self._max_file_bytes = max_file_bytes
        self._group_wait_s = max_group_wait_ms / 1000.0
        self._cond = threading.Condition(threading.Lock())
        # Guarded by _cond: records waiting for the journal thread.
        self._pending: list[tuple[int, object]] = []
        self._pending_bytes = 0
        self._pending_since = 0.0  # monotonic time of the oldest pending record
        self._group_future: Future[None] | None = None
        self._sleeping = False
        self._stopping = False
        self._drain_on_stop = True
        self._failure: BaseException | None = None
        # Owned by the journal thread.
        self._fd = -1
        self._seq = 0
        self._offset = 0
        self._type_crc: dict[int, int] = {}
        self._thread: threading.Thread | None = None
        # Without the thread: the group written by `write_pending` and not yet synced.
        self._written: _WrittenGroup | None = None
        # Files behind the checkpoint waiting to be reused, oldest first: the flush thread
        # adds them, the journal thread takes them when it rotates.
        self._spares_lock = threading.Lock()
        self._spares: list[Path] = []
        # Groups are laid out here and written in whole blocks, with O_DIRECT unless the
        # filesystem refuses it (tmpfs) or its device's blocks are larger than ours: no copy
        # into the page cache, no block read back to complete a partial one, no pages for the
        # flusher to compete with.
        self._blocks = Blocks()
        self._direct = True
        self.appended_records = 0  # records appended (the event-loop thread's count)
        self.bytes_written = 0

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, *, thread: bool = True) -> None:
        """Opens a new journal file (numbered after every existing one) and starts the
        journal thread (without `thread`, the caller runs `commit_pending()`)."""
        disk = self._disk
        existing = journal_files(self._path, disk)
        spares = sorted(
            self._path / name for name in disk.listdir(self._path) if name.startswith("recycle-")
        )
        for extra in spares[_SPARE_FILES:]:
            disk.unlink(extra)
        self._spares = spares[:_SPARE_FILES]
        self._open_file(existing[-1][0] + 1 if existing else 1)
        if thread:
            self._thread = threading.Thread(target=self._run, name="journal", daemon=True)
            self._thread.start()

    def stop(self, *, drain: bool = True) -> None:
        """Stops the journal thread. With `drain`, everything appended so far is written and
        synced first; without (a simulated crash), pending records are dropped and their
        futures fail."""
        with self._cond:
            self._stopping = True
            self._drain_on_stop = drain
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        else:
            if drain and self._failure is None:
                self.commit_pending()
            with self._cond:
                items, fut = self._pending, self._group_future
                self._pending, self._group_future = [], None
            self._fail(items, fut)
            written, self._written = self._written, None
            if written is not None:  # written, never synced: not durable
                self._fail(written.items, written.future)
        if self._fd >= 0:
            if drain and self._failure is None:
                # A reused file holds older records after ours: end it at our last one, so
                # that the next start finds a clean end, not a torn tail.
                with contextlib.suppress(OSError):
                    _cut(self._disk, self._fd, self._offset)
            self._disk.close(self._fd)
            self._fd = -1

    @property
    def failure(self) -> BaseException | None:
        """Returns the I/O error that stopped the journal, or None."""
        return self._failure

    @property
    def position(self) -> JournalPosition:
        """Returns the end of what the journal thread wrote so far (approximate while it runs)."""
        return JournalPosition(self._seq, self._offset)

    def delete_before(self, seq: int) -> int:
        """Retires the journal files numbered below `seq` (wholly before a checkpoint):
        up to _SPARE_FILES are kept, renamed, for reuse, the others deleted; returns how
        many. Replay never reads a retired file, whether or not its rename reached the disk
        (it is numbered below the checkpoint)."""
        retired = 0
        for file_seq, file_path in journal_files(self._path, self._disk):
            if file_seq >= seq or file_seq >= self._seq:
                break
            with contextlib.suppress(FileNotFoundError):
                with self._spares_lock:
                    keep = len(self._spares) < _SPARE_FILES
                    if keep:
                        spare = self._path / recycled_journal_name(file_seq)
                        self._disk.rename(file_path, spare)
                        self._spares.append(spare)
                if not keep:
                    self._disk.unlink(file_path)
                retired += 1
        if retired:
            log.debug("journal.retired_files", count=retired, before_seq=seq)
        return retired

    def disk_bytes(self) -> int:
        """Returns the total size of the journal files (spares included)."""
        total = 0
        with self._spares_lock:
            spares = list(self._spares)
        for file_path in [*(p for _, p in journal_files(self._path, self._disk)), *spares]:
            with contextlib.suppress(FileNotFoundError):
                total += self._disk.size(file_path)
        return total

    # -- appending (event-loop thread) ------------------------------------------------------

    def append(self, record_type: int, payload: bytes) -> Future[None]:
        """Queues one record; returns the future of the group commit that will cover it
        (completed after its fdatasync, or failed with a `StorageError`)."""
        size = len(payload) + JOURNAL_RECORD_PREFIX.size
        with self._cond:
            if self._failure is not None or self._stopping:
                return self._failed_future()
            fut = self._group_future
            new_group = fut is None
            if fut is None:
                fut = self._group_future = _running_future()
                self._pending_since = self._clock()
            self._pending.append((record_type, payload))
            self._pending_bytes += size
            if self._sleeping:
                self._cond.notify()
        self.appended_records += 1
        if new_group and self.on_group is not None:
            self.on_group()
        return fut

    def mark(self) -> Future[JournalPosition]:
        """Returns a future of the journal position right after every record appended so
        far (a checkpoint candidate); completed once those records are written."""
        fut: Future[JournalPosition] = Future()
        fut.set_running_or_notify_cancel()
        with self._cond:
            if self._failure is not None or self._stopping:
                fut.set_exception(self._failure_error())
                return fut
            new_group = self._group_future is None
            if new_group:
                self._group_future = _running_future()
                self._pending_since = self._clock()
            self._pending.append((MARK, fut))
            if self._sleeping:
                self._cond.notify()
        if new_group and self.on_group is not None:
            self.on_group()
        return fut

    def _failure_error(self) -> StorageError:
        if self._failure is not None:
            return StorageError(f"journal failed: {self._failure!r}", path=str(self._path))
        return StorageError("journal stopped", path=str(self._path))

    def _failed_future(self) -> Future[None]:
        fut = _running_future()
        fut.set_exception(self._failure_error())
        return fut

    # -- the journal thread -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                # Records that arrived while the previous group was being written and synced:
                # adds are streaming in, and the group may wait a little to grow. A record that
                # finds the journal idle is committed at once: waiting would only add
                # `max_group_wait_ms` to a lone writer's every add (nothing else is coming).
                streaming = bool(self._pending)
                while not self._pending and not self._stopping:
                    self._sleeping = True
                    self._cond.wait()
                    self._sleeping = False
                if self._stopping and (not self._drain_on_stop or not self._pending):
                    items, fut = self._pending, self._group_future
                    self._pending, self._group_future = [], None
                    break
                if streaming:
                    self._grow_group()
                items, fut = self._pending, self._group_future
                self._pending, self._pending_bytes, self._group_future = [], 0, None
            # After a failure the thread stays only to fail what arrives meanwhile; appends
            # after it are failed at once by append().
            self._commit_group(items, fut)
        # Stopped without draining (a simulated crash): fail what was never written.
        self._fail(items, fut)

    def commit_pending(self) -> bool:
        """Commits every pending record now, with one write and one fdatasync, and completes
        their future: the journal thread's step, for a caller that runs the journal without
        its thread (the simulator). A group written by `write_pending` is synced first.
        Returns whether anything was pending."""
        synced = self.sync_written()
        written = self.write_pending()
        if written:
            self.sync_written()
        return synced or written

    def write_pending(self) -> bool:
        """Writes the pending records (one writev series) without syncing them: the first
        half of a group commit, for a caller without the thread that gives the fdatasync its
        own time (the simulator); `sync_written()` completes it. Returns whether anything was
        pending."""
        invariant(self._written is None, "one journal group written and not synced at a time")
        with self._cond:
            items, fut = self._pending, self._group_future
            self._pending, self._pending_bytes, self._group_future = [], 0, None
        if not items:
            return False
        invariant(fut is not None, "a pending group has a future")
        assert fut is not None
        try:
            self._written = self._write(items, fut)
        except Exception as e:  # an I/O error: nothing more can be promised
            self._failed(e, items, fut)
        return True

    def sync_written(self) -> bool:
        """Syncs the group `write_pending` wrote and completes its future and marks (the
        second half of a group commit); returns whether there was one."""
        group, self._written = self._written, None
        if group is None:
            return False
        try:
            self._sync(group)
        except Exception as e:
            self._failed(e, group.items, group.future)
        return True

    def _commit_group(self, items: list[tuple[int, object]], fut: Future[None] | None) -> None:
        invariant(fut is not None, "a pending group has a future")
        assert fut is not None
        try:
            self._sync(self._write(items, fut))
        except Exception as e:  # an I/O error: nothing more can be promised
            self._failed(e, items, fut)

    def _failed(self, error: Exception, items: list[tuple[int, object]], fut: Future[None]) -> None:
        """Fails the journal: this group, and everything appended after it."""
        log.error("journal.failed", error=repr(error), path=str(self._path))
        with self._cond:
            self._failure = error
            items = items + self._pending
            newer_fut = self._group_future
            self._pending, self._group_future = [], None
        self._fail(items, fut)
        self._fail([], newer_fut)

    def _grow_group(self) -> None:
        """Waits (holding _cond's lock between waits) until the group is old or big enough:
        `max_group_wait_ms` after its oldest record arrived, so records that already waited
        out a sync go at once."""
        if self._group_wait_s <= 0:
            return
        deadline = self._pending_since + self._group_wait_s
        while self._pending_bytes < _GROUP_GROW_BYTES and not self._stopping:
            remaining = deadline - self._clock()
            if remaining <= 0:
                return
            self._cond.wait(remaining)

    def _fail(self, items: list[tuple[int, object]], fut: Future[None] | None) -> None:
        error = self._failure_error()
        if fut is not None and not fut.done():
            fut.set_exception(error)
        for record_type, payload in items:
            if record_type == MARK:
                mark = payload
                assert isinstance(mark, Future)
                if not mark.done():
                    mark.set_exception(error)

    def _write(self, items: list[tuple[int, object]], fut: Future[None]) -> _WrittenGroup:
        """Writes `items` in whole blocks (no sync); returns the written group."""
        started = self._clock()
        if self._offset >= self._max_file_bytes and any(kind != MARK for kind, _ in items):
            self._rotate()  # not for marks alone: they can stay at this file's end
        marks: list[tuple[Future[JournalPosition], JournalPosition]] = []
        seq, offset = self._seq, self._offset

        def on_mark(mark: object, at: int) -> None:
            assert isinstance(mark, Future)
            marks.append((mark, JournalPosition(seq, offset + at)))

        data, records = self._blocks.group(items, self._type_crc, on_mark)
        size = len(data)
        if size:
            self._write_all(data, offset)
            self._offset += size
            if self._ack_before_sync:
                fut.set_result(None)
        return _WrittenGroup(items, fut, marks, size, records, started)

    def _sync(self, group: _WrittenGroup) -> None:
        """Syncs a written group (one fdatasync), then resolves its marks and its future."""
        if group.size:
            self._disk.fdatasync(self._fd)
            self.bytes_written += group.size
            _JOURNAL_BYTES.inc(group.size)
            metrics.JOURNAL_SYNC_SECONDS.observe(self._clock() - group.started)
            metrics.JOURNAL_GROUP_RECORDS.observe(group.records)
        for mark, position in group.marks:
            mark.set_result(position)
        if not group.future.done():
            group.future.set_result(None)

    def _write_all(self, data: memoryview, offset: int) -> None:
        written = 0
        size = len(data)
        while written < size:  # a short write (rare) is finished from where it stopped
            try:
                written += self._disk.pwrite(self._fd, data[written:], offset + written)
            except OSError as e:
                if e.errno != errno.EINVAL or not self._direct:
                    raise
                # A device whose blocks are larger than ours: on without O_DIRECT, in this
                # file and the next ones.
                self._direct = self._disk.set_direct(self._fd, False)
                log.info("journal.no_direct_io", seq=self._seq)

    def _open_file(self, seq: int) -> None:
        """Opens journal file `seq`: a spare overwritten in place when there is one, else a
        new file. A spare gets its new header durably before its new name, so a crash leaves
        either a spare or a journal file whose records after the header fail their crcs (an
        empty last file)."""
        file_path = self._path / journal_file_name(seq)
        header = self._blocks.header(seq)
        with self._spares_lock:
            spare = self._spares.pop(0) if self._spares else None
        disk = self._disk
        if spare is not None:
            self._fd = disk.open(spare, os.O_WRONLY)
        else:
            self._fd = disk.open(file_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        if self._direct and not disk.set_direct(self._fd, True):
            self._direct = False  # the filesystem has no O_DIRECT (tmpfs): from now on
            log.info("journal.no_direct_io", seq=seq)
        self._write_all(header, 0)
        if spare is not None:
            disk.fdatasync(self._fd)
            disk.rename(spare, file_path)
        else:
            disk.fsync(self._fd)
        disk.fsync_dir(self._path)
        self._seq, self._offset = seq, JOURNAL_BLOCK
        self._type_crc = _type_crcs(journal_seed(seq))
        log.debug("journal.opened", path=str(file_path), seq=seq, reused=spare is not None)

    def _rotate(self) -> None:
        # The file may be a reused one with older records after ours: it must end at our
        # last record before a newer file follows it (replay reads an older file to its end).
        _cut(self._disk, self._fd, self._offset)
        self._disk.close(self._fd)
        self._fd = -1
        self._open_file(self._seq + 1)
