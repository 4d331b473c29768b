"""Truncation (the TRUNCATE flag and Truncate) and trimming: entries go from the cache, the
flushing snapshot and the index, durably, and a flush racing with them never brings them back."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from stream.bookie.storage import StreamStorage
from stream.bookie.storage.codec import STREAM_STATE
from stream.bookie.storage.state import LocalStreamState
from stream.bookie.unsafe import SAFE, UnsafeSkips, parse_unsafe_skips
from stream.wire import bookie_pb2 as pb

from .storage_support import (
    add_request,
    crash_and_reopen,
    entry,
    flush,
    make_config,
    open_storage,
    wait,
    wait_until,
)


@pytest.fixture(params=[True, False], ids=["journal", "no-journal"])
def config(request: pytest.FixtureRequest, tmp_path: Path):
    return make_config(tmp_path, journal_write_data=request.param)


def _held(storage: StreamStorage, stream_id: int, upto: int) -> list[int]:
    return [i for i in range(upto) if storage.read(stream_id, i).code == pb.OK]


def test_truncate_flag_deletes_higher_entries_everywhere(config) -> None:
    storage, _ = open_storage(config)
    wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(10)])).durable)
    flush(storage)  # 0..9 in the index
    wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(10, 15)])).durable)
    # A new term's recovery ends with a TRUNCATE no-op at 6: 7.. go, wherever they are.
    noop = entry(7, 6, b"", flags=pb.NOOP | pb.TRUNCATE)
    outcome = storage.add_batch(add_request(7, 2, [noop]))
    assert outcome.codes == [pb.OK]
    assert outcome.durable is not None
    wait(outcome.durable)
    assert _held(storage, 7, 20) == list(range(7))
    assert storage.read(7, 6).entry.flags == pb.NOOP | pb.TRUNCATE
    assert storage.stream_state(7).last_entry_id == 6
    storage, _ = crash_and_reopen(storage, config)
    try:
        assert _held(storage, 7, 20) == list(range(7))
        # Even without the journal the no-op itself is journaled: a crash must not bring the
        # flushed older 6 back (a positive answer with the wrong bytes).
        assert storage.read(7, 6).entry.flags == pb.NOOP | pb.TRUNCATE
        assert all(storage.read(7, i).code != pb.OK for i in range(7, 20))
        flush(storage)
        assert all(storage.read(7, i).code != pb.OK for i in range(7, 20))
    finally:
        storage.close()


def test_entries_after_a_truncate_entry_in_the_same_batch_stay(config) -> None:
    storage, _ = open_storage(config)
    try:
        wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(10)])).durable)
        batch = [entry(7, 4, flags=pb.TRUNCATE), entry(7, 5, b"new 5"), entry(7, 6, b"new 6")]
        wait(storage.add_batch(add_request(7, 2, batch)).durable)
        assert _held(storage, 7, 12) == list(range(7))
        assert storage.read(7, 5).entry.payload == b"new 5"
        assert storage.stream_state(7).last_entry_id == 6
    finally:
        storage.close()


def test_truncate_survives_restart(config) -> None:
    storage, _ = open_storage(config)
    wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(10)])).durable)
    flush(storage)
    wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(10, 20)])).durable)
    outcome = storage.truncate(7, 3, 4)
    assert (outcome.code, outcome.bookie_term) == (pb.OK, 3)
    wait(outcome.durable)
    assert _held(storage, 7, 25) == list(range(5))
    assert storage.stream_state(7).last_entry_id == 4
    storage, report = crash_and_reopen(storage, config)
    try:
        assert _held(storage, 7, 25) == list(range(5))
        assert storage.stream_state(7).term == 3
    finally:
        storage.close()
    storage, _ = open_storage(config)
    try:
        assert _held(storage, 7, 25) == list(range(5))
        # -1 drops everything (a newer term's: term 3's points only move forward).
        wait(storage.truncate(7, 4, -1).durable)
        assert _held(storage, 7, 25) == []
        assert storage.stream_state(7).last_entry_id == -1
        assert storage.truncate(7, 4, -2).code == pb.BAD_REQUEST
    finally:
        storage.close()


def test_truncate_of_unknown_stream_records_its_term(config) -> None:
    storage, _ = open_storage(config)
    try:
        wait(storage.truncate(9, 2, -1).durable)
        assert storage.stream_state(9).term == 2
        assert storage.truncate(9, 1, -1).code == pb.INVALID_TERM
        assert storage.truncate(9, 0, -1).code == pb.BAD_REQUEST
    finally:
        storage.close()


def test_truncate_during_a_flush_wins(config) -> None:
    storage, _ = open_storage(config)
    try:
        wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(20)])).durable)
        # Hold the entry logs so the flush stops after taking its snapshot.
        storage._store.logs.lock.acquire()
        done = storage.request_flush()
        wait_until(lambda: storage._store.snapshot is not None)
        wait(storage.truncate(7, 1, 9).durable)
        wait(storage.trim(7, 3).durable)
        assert _held(storage, 7, 20) == list(range(3, 10))
        storage._store.logs.lock.release()
        wait(done)
        assert _held(storage, 7, 20) == list(range(3, 10))
        assert storage.stats()["index_entries"] == 7
    finally:
        if storage._store.logs.lock.locked():
            storage._store.logs.lock.release()
        storage.close()


def test_trim_drops_lower_entries_and_reads_answer_trimmed(config) -> None:
    storage, _ = open_storage(config)
    wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(10)])).durable)
    flush(storage)
    wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(10, 20)])).durable)
    outcome = storage.trim(7, 12)
    assert (outcome.code, outcome.first_entry_id) == (pb.OK, 12)
    wait(outcome.durable)
    read = storage.read(7, 11)
    assert (read.code, read.first_entry_id) == (pb.TRIMMED, 12)
    assert storage.read(7, 12).code == pb.OK
    assert list(storage.read_range(7, 5, 15, 0)) == [(pb.TRIMMED, [])]
    # Never backwards; unknown streams and bad ids are answered without change.
    outcome = storage.trim(7, 5)
    assert (outcome.code, outcome.first_entry_id, outcome.durable) == (pb.OK, 12, None)
    assert storage.trim(8, 5).code == pb.NO_SUCH_STREAM
    assert storage.trim(7, -1).code == pb.BAD_REQUEST
    # Adds below the trim point are not stored.
    assert storage.add_batch(add_request(7, 1, [entry(7, 3), entry(7, 20)])).codes == [
        pb.TRIMMED,
        pb.OK,
    ]
    storage, _ = crash_and_reopen(storage, config)
    try:
        assert storage.read(7, 11).code == pb.TRIMMED
        assert storage.stream_state(7).first_entry_id == 12
        report = storage.gc_once()
        assert report.trimmed_entries == 10  # 0..9 were in the index
        if config.journal_write_data:
            assert storage.read(7, 12).code == pb.OK
    finally:
        storage.close()


def test_concurrent_flushes_and_truncates_keep_the_model(tmp_path: Path) -> None:
    # Truncates and adds race with a flusher that flushes continuously.
    config = make_config(tmp_path, flush_interval_ms=1)
    storage, _ = open_storage(config)
    try:
        model: dict[int, bytes] = {}
        stop = threading.Event()
        for round_ in range(30):
            base = round_ * 10
            entries = [entry(7, base + i, f"{round_}-{i}".encode()) for i in range(20)]
            wait(storage.add_batch(add_request(7, 1, entries)).durable)
            model.update({e.entry_id: e.payload for e in entries})
            after = base + 9
            wait(storage.truncate(7, 1, after).durable)
            model = {k: v for k, v in model.items() if k <= after}
        stop.set()
        flush(storage)
        for entry_id in range(310):
            got = storage.read(7, entry_id)
            if entry_id in model:
                assert got.code == pb.OK and got.entry.payload == model[entry_id]
            else:
                assert got.code == pb.NO_SUCH_ENTRY
    finally:
        storage.close()


@pytest.mark.parametrize("restart", [False, True], ids=["running", "restarted"])
def test_a_late_truncate_of_the_same_term_keeps_what_the_term_wrote_since(
    config, restart: bool
) -> None:
    storage = _late_truncate_after_a_newer_one(config, SAFE, restart)
    try:
        late = storage.truncate(7, 3, 47)
        assert late.code == pb.BAD_REQUEST
        assert "stale" in late.message
        again = storage.truncate(7, 3, 53)  # a duplicate of the applied one
        assert again.code == pb.OK
        assert _held(storage, 7, 70) == list(range(60))
        # A newer term's recovery may still truncate lower.
        wait(storage.truncate(7, 4, 47).durable)
        assert _held(storage, 7, 70) == list(range(48))
    finally:
        storage.close()


def test_without_the_order_check_a_late_truncate_deletes_the_terms_entries(config) -> None:
    storage = _late_truncate_after_a_newer_one(
        config, parse_unsafe_skips("truncate_order"), restart=False
    )
    try:
        late = storage.truncate(7, 3, 47)
        assert late.code == pb.OK
        wait(late.durable)
        assert _held(storage, 7, 70) == list(range(48))
    finally:
        storage.close()


def _late_truncate_after_a_newer_one(config, unsafe: UnsafeSkips, restart: bool) -> StreamStorage:
    """A bookie that holds 0..59 of stream 7: an earlier term's 0..53 (flushed), then
    Truncate(term 3, after 53) and term 3's 54..59; optionally crashed and reopened."""
    storage = StreamStorage(config, unsafe=unsafe)
    storage.open()
    wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(54)])).durable)
    flush(storage)
    wait(storage.truncate(7, 3, 53).durable)
    wait(storage.add_batch(add_request(7, 3, [entry(7, i) for i in range(54, 60)])).durable)
    if restart:
        flush(storage)  # 54..59 durable without the journal's data too
        storage.abandon()
        storage = StreamStorage(config, unsafe=unsafe)
        storage.open()
    assert _held(storage, 7, 70) == list(range(60))
    return storage


def test_a_state_stored_before_the_truncate_point_was_kept_reads_as_none_applied() -> None:
    raw = STREAM_STATE.pack(3, 0, 9, 9, 12, 0)
    state = LocalStreamState.unpack(raw)
    assert (state.term, state.last_entry_id) == (3, 12)
    assert (state.truncate_term, state.truncate_after) == (0, -1)
    state.truncate_term, state.truncate_after = 3, 10
    again = LocalStreamState.unpack(state.pack())
    assert (again.truncate_term, again.truncate_after) == (3, 10)
