"""Crash recovery: journal replay after a kill -9 restores acknowledged entries, a clean close
replays nothing, the journal-off mode keeps state changes and flushed entries, torn journal
tails are tolerated and real corruption is not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stream.bookie.storage.codec import JOURNAL_BLOCK, JOURNAL_RECORD_PREFIX
from stream.bookie.storage.journal import JournalPosition, journal_files, replay
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


def test_crash_replays_acknowledged_entries_with_their_bytes(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    storage, report = open_storage(config)
    assert report.records_replayed == 0
    written = {}
    for batch in range(5):
        entries = [entry(7, batch * 10 + i, os.urandom(200)) for i in range(10)]
        wait(storage.add_batch(add_request(7, 1, entries, lac=batch * 10 - 1)).durable)
        written.update({e.entry_id: e for e in entries})
        if batch == 2:
            flush(storage)  # some in entry logs, the rest only in the journal
    storage, report = crash_and_reopen(storage, config)
    try:
        assert report.unclean
        assert report.records_replayed == 2
        assert report.entries_replayed == 20
        for entry_id, e in written.items():
            got = storage.read(7, entry_id)
            assert got.code == pb.OK and got.entry == e
        assert storage.lac(7)[0] == 39
        assert storage.stream_state(7).last_entry_id == 49
    finally:
        storage.close()


def test_clean_close_replays_nothing(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    storage, _ = open_storage(config)
    wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(10)])).durable)
    wait(storage.fence(8, 3).durable)
    wait(storage.trim(7, 2).durable)
    storage.close()
    storage, report = open_storage(config)
    try:
        assert (report.records_replayed, report.entries_replayed, report.unclean) == (0, 0, False)
        assert storage.read(7, 5).code == pb.OK
        assert storage.read(7, 1).code == pb.TRIMMED
        assert storage.stream_state(8).term == 3
        # Journal files wholly before the checkpoint are gone.
        assert len(journal_files(config.journal_path)) <= 2
    finally:
        storage.close()


def test_repeated_crashes_keep_everything_acknowledged(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    storage, _ = open_storage(config)
    written = {}
    for round_ in range(4):
        entries = [entry(7, round_ * 5 + i) for i in range(5)]
        wait(storage.add_batch(add_request(7, 1, entries)).durable)
        written.update({e.entry_id: e for e in entries})
        storage, report = crash_and_reopen(storage, config)
        assert report.entries_replayed == len(written)
    try:
        for entry_id, e in written.items():
            assert storage.read(7, entry_id).entry == e
    finally:
        storage.close()


def test_without_journal_state_changes_survive_and_flushed_entries_too(tmp_path: Path) -> None:
    config = make_config(tmp_path, journal_write_data=False)
    storage, _ = open_storage(config)
    outcome = storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(10)]))
    wait(outcome.durable)  # the new term
    flush(storage)
    outcome = storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(10, 20)]))
    assert outcome.durable is None  # same term, no journal: nothing to wait for
    wait(storage.add_batch(add_request(7, 2, [entry(7, 20)])).durable)
    wait(storage.truncate(7, 2, 7).durable)
    wait(storage.trim(7, 3).durable)
    wait(storage.set_limbo(7, True))
    wait(storage.fence(8, 5).durable)
    storage, report = crash_and_reopen(storage, config)
    try:
        assert report.unclean
        assert report.entries_replayed == 0
        state = storage.stream_state(7)
        assert (state.term, state.limbo, state.first_entry_id) == (2, True, 3)
        assert storage.stream_state(8).term == 5
        assert storage.read(7, 2).code == pb.TRIMMED
        for entry_id in range(3, 8):
            assert storage.read(7, entry_id).code == pb.OK  # flushed before the crash
        assert storage.read(7, 8).code == pb.UNKNOWN  # truncated (and in limbo)
        wait(storage.set_limbo(7, False))
        assert storage.read(7, 9).code == pb.NO_SUCH_ENTRY
        assert storage.read(7, 15).code == pb.NO_SUCH_ENTRY  # never flushed: lost
    finally:
        storage.close()


def test_torn_journal_tail_is_tolerated(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    storage, _ = open_storage(config)
    wait(storage.add_batch(add_request(7, 1, [entry(7, 0)])).durable)
    wait(storage.add_batch(add_request(7, 1, [entry(7, 1)])).durable)
    storage.abandon()
    # Tear the last record: cut it in the middle, as a crash during its write would. Its group
    # (the record and its padding, zeros after them) is the last block written.
    journal = files(config.journal_path, "journal-")[-1]
    data = journal.read_bytes().rstrip(b"\0")
    last_group = (len(data) - 1) // JOURNAL_BLOCK * JOURNAL_BLOCK
    journal.write_bytes(data[: last_group + JOURNAL_RECORD_PREFIX.size + 5])
    storage, report = open_storage(config)
    assert report.records_replayed == 1
    assert storage.read(7, 0).code == pb.OK
    assert storage.read(7, 1).code == pb.NO_SUCH_ENTRY
    wait(storage.add_batch(add_request(7, 1, [entry(7, 2)])).durable)
    # The torn file was cut, so a second crash replays it cleanly as an older file.
    storage, report = crash_and_reopen(storage, config)
    try:
        assert report.records_replayed == 2
        assert storage.read(7, 2).code == pb.OK
    finally:
        storage.close()


def test_garbage_after_the_last_record_is_cut(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    storage, _ = open_storage(config)
    wait(storage.add_batch(add_request(7, 1, [entry(7, 0)])).durable)
    storage.abandon()
    journal = files(config.journal_path, "journal-")[-1]
    data = journal.read_bytes().rstrip(b"\0")
    journal.write_bytes(data + b"\x07\x00\x00\x00garbage")
    storage, report = open_storage(config)
    try:
        assert report.records_replayed == 1
        assert storage.read(7, 0).code == pb.OK
    finally:
        storage.close()


def test_corrupt_record_in_an_older_journal_file_is_an_error(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    storage, _ = open_storage(config)
    wait(storage.add_batch(add_request(7, 1, [entry(7, 0, b"a" * 100)])).durable)
    storage, _ = crash_and_reopen(storage, config)  # a newer journal file now exists
    wait(storage.add_batch(add_request(7, 1, [entry(7, 1)])).durable)
    storage.abandon()
    older = files(config.journal_path, "journal-")[0]
    data = bytearray(older.read_bytes())
    data[JOURNAL_BLOCK + 40] ^= 0xFF  # inside the first record's body
    older.write_bytes(bytes(data))
    with pytest.raises(StorageError, match="corrupt journal"):
        list(replay(config.journal_path, JournalPosition(0, 0)))


def test_headerless_last_journal_file_is_dropped(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    storage, _ = open_storage(config)
    wait(storage.add_batch(add_request(7, 1, [entry(7, 0)])).durable)
    storage.abandon()
    # A crash right after creating the next file, before its header reached the disk.
    (config.journal_path / "journal-00000000000000ff.log").write_bytes(b"")
    storage, report = open_storage(config)
    try:
        assert report.records_replayed == 1
        assert not (config.journal_path / "journal-00000000000000ff.log").exists()
    finally:
        storage.close()


def test_replay_larger_than_the_cache_flushes_on_the_way(tmp_path: Path) -> None:
    config = make_config(tmp_path, write_cache_max_bytes=16 << 10)
    storage, _ = open_storage(make_config(tmp_path))  # a big cache while writing
    written = []
    for batch in range(10):
        entries = [entry(7, batch * 10 + i, os.urandom(500)) for i in range(10)]
        wait(storage.add_batch(add_request(7, 1, entries)).durable)
        written += entries
    storage.abandon()
    storage, report = open_storage(config)
    try:
        assert report.entries_replayed == 100
        assert storage.stats()["flushes"] >= 2
        for e in written:
            assert storage.read(7, e.entry_id).entry == e
    finally:
        storage.abandon()
    storage, report = open_storage(config)
    try:
        assert report.entries_replayed < 100  # the checkpoint moved during the replay
        for e in written:
            assert storage.read(7, e.entry_id).entry == e
    finally:
        storage.close()


def test_journal_rotates_and_old_files_are_deleted(tmp_path: Path) -> None:
    config = make_config(tmp_path, journal_max_file_bytes=8 << 10)
    storage, _ = open_storage(config)
    for batch in range(20):
        entries = [entry(7, batch * 4 + i, os.urandom(500)) for i in range(4)]
        wait(storage.add_batch(add_request(7, 1, entries)).durable)
    assert len(journal_files(config.journal_path)) >= 5
    storage, report = crash_and_reopen(storage, config)
    assert report.entries_replayed == 80
    flush(storage)
    assert len(journal_files(config.journal_path)) == 1
    storage.close()


def test_journal_io_error_fails_waiters_and_later_requests(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    storage, _ = open_storage(config)
    wait(storage.add_batch(add_request(7, 1, [entry(7, 0)])).durable)
    # Inject an I/O error: the journal's file descriptor goes away under it.
    os.close(storage._store.journal._fd)
    outcome = storage.add_batch(add_request(7, 1, [entry(7, 1)]))
    with pytest.raises(StorageError):
        wait(outcome.durable)
    assert storage.add_batch(add_request(7, 1, [entry(7, 2)])).codes == [pb.INTERNAL]
    assert storage.fence(7, 2).code == pb.INTERNAL
    storage._store.journal._fd = -1  # already closed above
    storage.abandon()
    storage, report = open_storage(config)
    try:
        assert report.unclean
        assert storage.read(7, 0).code == pb.OK  # acknowledged before the failure
    finally:
        storage.close()
