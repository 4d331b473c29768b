"""Journal files behind the checkpoint are reused in place instead of deleted: a reused file's
earlier records are never replayed (their crcs are seeded with the file's old number), a file
that a newer one follows ends at its last record, a crash at any point of the reuse replays
exactly what was acknowledged, and version 1 files (unseeded crcs) still replay."""

from __future__ import annotations

import os
from pathlib import Path

import crc32c
import pytest

from stream.bookie.storage.codec import (
    JOURNAL_BLOCK,
    JOURNAL_FILE_HEADER,
    JOURNAL_MAGIC,
    JOURNAL_MAGIC_V1,
    JOURNAL_MAGIC_V2,
    JOURNAL_RECORD_PREFIX,
    REC_ADD,
    journal_file_name,
)
from stream.bookie.storage.journal import JournalPosition, journal_files, journal_seed, replay
from stream.errors import StorageError
from stream.wire import bookie_pb2 as pb

from .storage_support import (
    add_request,
    crash_and_reopen,
    entry,
    files,
    flush,
    make_config,
    open_storage,
    wait,
)

SMALL_FILES = 16 << 10  # three 4 KiB groups after the header block


def append_batches(storage, first_batch: int, batches: int) -> list[pb.Entry]:
    written = []
    for batch in range(first_batch, first_batch + batches):
        entries = [entry(7, batch * 4 + i, os.urandom(500)) for i in range(4)]
        wait(storage.add_batch(add_request(7, 1, entries)).durable)
        written += entries
    return written


def test_retired_files_are_reused_and_their_old_records_never_replayed(tmp_path: Path) -> None:
    config = make_config(tmp_path, journal_max_file_bytes=SMALL_FILES)
    storage, _ = open_storage(config)
    append_batches(storage, 0, 20)
    flush(storage)  # every file but the current one is behind the checkpoint now
    spares = files(config.journal_path, "recycle-")
    assert len(spares) == 2
    spare_inodes = {p.stat().st_ino for p in spares}
    written: list[pb.Entry] = []
    while files(config.journal_path, "recycle-"):  # until both spares are in use
        written += append_batches(storage, 20 + len(written) // 4, 1)
    in_use = {p.stat().st_ino for _, p in journal_files(config.journal_path)}
    assert spare_inodes <= in_use
    # The current file was reused: after its last record come an earlier file's records.
    last = journal_files(config.journal_path)[-1][1]
    assert last.stat().st_ino in spare_inodes
    storage, report = crash_and_reopen(storage, config)
    try:
        assert report.entries_replayed == len(written)
        for e in written:
            assert storage.read(7, e.entry_id).entry == e
        assert storage.stream_state(7).last_entry_id == written[-1].entry_id
    finally:
        storage.close()


def test_a_rotation_ends_the_reused_file_at_its_last_record(tmp_path: Path) -> None:
    config = make_config(tmp_path, journal_max_file_bytes=SMALL_FILES)
    storage, _ = open_storage(config)
    # Long files first (a 6 KiB record may pass the limit), then short records: the reused
    # files end well before where they ended before.
    for entry_id in range(12):
        add = add_request(7, 1, [entry(7, entry_id, os.urandom(6 << 10))])
        wait(storage.add_batch(add).durable)
    flush(storage)
    assert len(files(config.journal_path, "recycle-")) == 2
    written = []
    for entry_id in range(12, 200):
        written.append(entry(7, entry_id, os.urandom(100)))
        wait(storage.add_batch(add_request(7, 1, [written[-1]])).durable)
    assert not files(config.journal_path, "recycle-")
    storage.abandon()
    # Every file but the last is read to its end by replay: a stale tail would be corruption.
    records = list(replay(config.journal_path, JournalPosition(0, 0)))
    replayed_ids = {
        e.entry_id
        for r in records
        if r.type == REC_ADD
        for e in pb.AddRequest.FromString(r.payload).entries
    }
    assert {e.entry_id for e in written} <= replayed_ids


def test_a_clean_close_ends_the_reused_file_at_its_last_record(tmp_path: Path) -> None:
    config = make_config(tmp_path, journal_max_file_bytes=SMALL_FILES)
    storage, _ = open_storage(config)
    append_batches(storage, 0, 20)
    flush(storage)
    append_batches(storage, 20, 6)
    last_seq, last = journal_files(config.journal_path)[-1]
    storage.close()
    # A newer file follows it now: the closed file is replayed as an older one, to its end.
    newer = config.journal_path / journal_file_name(last_seq + 1)
    newer.write_bytes(JOURNAL_FILE_HEADER.pack(JOURNAL_MAGIC, last_seq + 1))
    assert list(replay(config.journal_path, JournalPosition(last_seq, 0)))


def test_crash_after_a_spare_took_its_new_name_replays_nothing_from_it(tmp_path: Path) -> None:
    config = make_config(tmp_path, journal_max_file_bytes=SMALL_FILES)
    storage, _ = open_storage(config)
    append_batches(storage, 0, 20)
    flush(storage)
    written = append_batches(storage, 20, 1)
    storage.abandon()
    # The crash came while the next file was being opened: the spare has its new header and
    # name, and after the header still the records of the file it was.
    last_seq = journal_files(config.journal_path)[-1][0]
    spare = files(config.journal_path, "recycle-")[0]
    size = spare.stat().st_size
    fd = os.open(spare, os.O_WRONLY)
    os.pwrite(fd, header_block(JOURNAL_MAGIC, last_seq + 1), 0)
    os.close(fd)
    reused = spare.rename(config.journal_path / journal_file_name(last_seq + 1))
    storage, report = open_storage(config)
    try:
        assert report.entries_replayed == len(written)
        for e in written:
            assert storage.read(7, e.entry_id).entry == e
        assert storage.stream_state(7).last_entry_id == written[-1].entry_id
        # Its stale records were cut off, so it reads clean as an older file from now on.
        assert reused.stat().st_size == JOURNAL_BLOCK < size
    finally:
        storage.close()


def header_block(magic: bytes, seq: int) -> bytes:
    """Returns a version 3 file's first block."""
    return JOURNAL_FILE_HEADER.pack(magic, seq).ljust(JOURNAL_BLOCK, b"\0")


def record(payload: bytes, seed: int = 0) -> bytes:
    """Returns a journal record of `payload` whose crc continues from `seed` (0: version 1)."""
    body = bytes([REC_ADD]) + payload
    return JOURNAL_RECORD_PREFIX.pack(len(body), crc32c.crc32c(body, seed), REC_ADD) + payload


def test_records_of_the_file_a_reused_one_was_are_not_replayed(tmp_path: Path) -> None:
    ours, stale = b"ours" * 10, b"old!" * 10  # one size: the old records line up with ours
    head = header_block(JOURNAL_MAGIC, 5) + record(ours, journal_seed(5))
    path = tmp_path / journal_file_name(5)
    path.write_bytes(head + record(stale, journal_seed(3)) + record(stale, journal_seed(3)))
    records = list(replay(tmp_path, JournalPosition(0, 0)))
    assert [r.payload for r in records] == [ours]
    assert path.stat().st_size == len(head)  # the last file is cut at its last record


def test_version_1_files_still_replay_and_their_crcs_do_not_pass_in_later_versions(
    tmp_path: Path,
) -> None:
    payload = add_request(7, 1, [entry(7, 0)]).SerializeToString()
    v1 = tmp_path / journal_file_name(1)
    v1.write_bytes(JOURNAL_FILE_HEADER.pack(JOURNAL_MAGIC_V1, 1) + record(payload))
    records = list(replay(tmp_path, JournalPosition(0, 0)))
    assert [(r.type, r.payload) for r in records] == [(REC_ADD, payload)]
    # The same record under a later header is a stale one: in an older file, corruption.
    v2 = tmp_path / journal_file_name(2)
    v2.write_bytes(JOURNAL_FILE_HEADER.pack(JOURNAL_MAGIC_V2, 2) + record(payload))
    v3 = tmp_path / journal_file_name(3)
    v3.write_bytes(header_block(JOURNAL_MAGIC, 3) + record(payload))
    (tmp_path / journal_file_name(4)).write_bytes(header_block(JOURNAL_MAGIC, 4))
    for seq in (2, 3):
        with pytest.raises(StorageError, match="corrupt journal"):
            list(replay(tmp_path, JournalPosition(seq, 0)))


def test_spares_beyond_the_limit_are_deleted_at_start(tmp_path: Path) -> None:
    config = make_config(tmp_path, journal_max_file_bytes=SMALL_FILES)
    storage, _ = open_storage(config)
    storage.close()
    for seq in range(100, 105):
        (config.journal_path / f"recycle-{seq:016x}.log").write_bytes(b"\0" * 64)
    storage, _ = open_storage(config)
    try:
        # One went into use as the new current file, one waits.
        assert len(files(config.journal_path, "recycle-")) == 1
    finally:
        storage.close()
