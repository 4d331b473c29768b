"""Version 3 journal files are written in whole blocks: every group ends on a block boundary
with a padding record that replay skips (and an older version's file may not hold), the groups
go out with O_DIRECT where the filesystem has it, and without it where it does not."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from stream.bookie.storage.codec import (
    JOURNAL_BLOCK,
    JOURNAL_FILE_HEADER,
    JOURNAL_MAGIC_V2,
    JOURNAL_RECORD_PREFIX,
    REC_ADD,
    REC_PAD,
    REC_TERM,
    journal_file_name,
)
from stream.bookie.storage.disk_port import OsDisk
from stream.bookie.storage.journal import (
    Journal,
    JournalPosition,
    _type_crcs,
    journal_files,
    journal_seed,
    replay,
)
from stream.bookie.storage.journal_blocks import MARK, Blocks, padded
from stream.errors import StorageError
from stream.framing import native

PREFIX = JOURNAL_RECORD_PREFIX.size
WAIT_S = 10.0


def test_a_group_is_padded_to_the_next_block_with_room_for_a_padding_record() -> None:
    for size in range(3 * JOURNAL_BLOCK + 2 * PREFIX):
        total = padded(size)
        assert total % JOURNAL_BLOCK == 0, size
        if size % JOURNAL_BLOCK == 0:
            assert total == size
        else:
            assert PREFIX <= total - size < JOURNAL_BLOCK + PREFIX, size


def test_groups_laid_out_in_blocks_replay_as_written_from_any_mark(tmp_path: Path) -> None:
    rng = random.Random(7)
    seq = 9
    type_crc = _type_crcs(journal_seed(seq))
    blocks = Blocks()
    data = bytearray(blocks.header(seq))
    written: list[tuple[int, bytes]] = []
    marks: list[tuple[JournalPosition, int]] = []  # position, records before it
    for _ in range(200):
        items: list[tuple[int, object]] = []
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.2:
                items.append((MARK, len(written) + sum(1 for k, _ in items if k != MARK)))
            else:
                size = rng.choice([0, 1, PREFIX, JOURNAL_BLOCK - 2 * PREFIX, rng.randint(0, 9000)])
                items.append((rng.choice([REC_ADD, REC_TERM]), rng.randbytes(size)))
        at_mark: list[tuple[object, int]] = []
        group, records = blocks.group(
            items, type_crc, lambda m, at, sink=at_mark: sink.append((m, at))
        )
        assert len(group) % JOURNAL_BLOCK == 0
        assert records == sum(1 for kind, _ in items if kind != MARK)
        for mark, at in at_mark:
            assert isinstance(mark, int)
            marks.append((JournalPosition(seq, len(data) + at), mark))
        data += group
        written += [(kind, payload) for kind, payload in items if kind != MARK]  # type: ignore[misc]
    (tmp_path / journal_file_name(seq)).write_bytes(bytes(data))
    replayed = [(r.type, r.payload) for r in replay(tmp_path, JournalPosition(seq, 0))]
    assert replayed == written
    assert marks
    for position, before in marks[:20]:
        after = [(r.type, r.payload) for r in replay(tmp_path, position)]
        assert after == written[before:]


def test_a_padding_record_in_a_version_2_file_is_corruption(tmp_path: Path) -> None:
    seed = journal_seed(1)
    body = bytes([REC_PAD]) + bytes(20)
    pad = JOURNAL_RECORD_PREFIX.pack(len(body), native.crc32c(body, seed), REC_PAD) + bytes(20)
    (tmp_path / journal_file_name(1)).write_bytes(
        JOURNAL_FILE_HEADER.pack(JOURNAL_MAGIC_V2, 1) + pad
    )
    (tmp_path / journal_file_name(2)).write_bytes(JOURNAL_FILE_HEADER.pack(JOURNAL_MAGIC_V2, 2))
    with pytest.raises(StorageError, match="unknown record type"):
        list(replay(tmp_path, JournalPosition(1, 0)))


def _journal(path: Path, disk: OsDisk | None = None, max_file_bytes: int = 1 << 20) -> Journal:
    path.mkdir(exist_ok=True)
    journal = Journal(
        path, max_file_bytes=max_file_bytes, max_group_wait_ms=0.0, disk=disk or OsDisk()
    )
    journal.start()
    return journal


def _append_some(journal: Journal, count: int) -> list[bytes]:
    """Appends `count` records, a group each."""
    payloads = [os.urandom(random.randint(1, 6000)) for _ in range(count)]
    for payload in payloads:
        journal.append(REC_ADD, payload).result(WAIT_S)
    return payloads


def _replayed(path: Path) -> list[bytes]:
    return [r.payload for r in replay(path, JournalPosition(0, 0))]


def _direct_io_works(path: Path) -> bool:
    probe = path / "probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644))
    except OSError as e:
        if e.errno == errno.EINVAL:
            return False
        raise
    finally:
        probe.unlink(missing_ok=True)
    return True


def _is_direct(fd: int) -> bool:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        flags = next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))
    return bool(flags & os.O_DIRECT)


def test_groups_go_out_with_o_direct_in_whole_blocks(tmp_path: Path) -> None:
    if not _direct_io_works(tmp_path):
        pytest.skip("this filesystem has no O_DIRECT")
    journal = _journal(tmp_path / "journal", max_file_bytes=64 << 10)
    try:
        payloads = _append_some(journal, 60)  # several files
        assert _is_direct(journal._fd)
        assert journal.position.offset % JOURNAL_BLOCK == 0
    finally:
        journal.stop()
    assert len(journal_files(tmp_path / "journal")) > 2
    assert _replayed(tmp_path / "journal") == payloads


class _NoDirectFilesystem(OsDisk):
    """A filesystem without O_DIRECT: it refuses to turn it on."""

    @staticmethod
    def set_direct(fd: int, on: bool) -> bool:
        if on:
            return False
        return OsDisk.set_direct(fd, on)


class _NoDirectWrite(OsDisk):
    """A device whose blocks are larger than the journal's: O_DIRECT writes fail."""

    @staticmethod
    def pwrite(fd: int, data: bytes | memoryview, offset: int, /) -> int:  # type: ignore[override]
        if _is_direct(fd):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return os.pwrite(fd, data, offset)


@pytest.mark.parametrize(
    "disk", [_NoDirectFilesystem(), _NoDirectWrite()], ids=["filesystem", "device"]
)
def test_without_o_direct_the_journal_writes_through_the_page_cache(
    tmp_path: Path, disk: OsDisk
) -> None:
    journal = _journal(tmp_path / "journal", disk, max_file_bytes=64 << 10)
    try:
        payloads = _append_some(journal, 60)
        assert not _is_direct(journal._fd)
    finally:
        journal.stop()
    assert _replayed(tmp_path / "journal") == payloads


def test_a_mark_alone_does_not_start_a_file(tmp_path: Path) -> None:
    journal = _journal(tmp_path / "journal", max_file_bytes=8 << 10)
    try:
        journal.append(REC_ADD, os.urandom(5000)).result(WAIT_S)  # the file is full now
        end = journal.position
        assert end.offset >= 8 << 10
        # A checkpoint's mark writes nothing: it stays at the full file's end, and a clean
        # close leaves no empty file behind.
        assert journal.mark().result(WAIT_S) == end
        assert [seq for seq, _ in journal_files(tmp_path / "journal")] == [end.seq]
        journal.append(REC_ADD, b"next").result(WAIT_S)  # a record does
        assert journal.position.seq == end.seq + 1
    finally:
        journal.stop()
