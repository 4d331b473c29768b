"""A bookie's reconciliation with metadata (stream/bookie/reconcile.py) against a real
ZooKeeper and a real storage engine in tmp_path: it trims below metadata's first retained
entry, trims a deleted stream away (both surviving a crash), and leaves alone what metadata
never knew or cannot tell."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from stream.bookie.config import BookieConfig
from stream.bookie.reconcile import TRIM_ALL, MetadataReconciler
from stream.bookie.storage import StreamStorage
from stream.metadata import MetadataSession, RetentionPolicy, StreamStore
from stream.wire import bookie_pb2 as pb
from tests.unit.bookie.storage_support import (
    add_request,
    crash_and_reopen,
    entry,
    flush,
    make_config,
    open_storage,
    wait,
)
from tests.unit.retention.support import build_stream

pytestmark = pytest.mark.integration


@pytest.fixture
def config(tmp_path: Path) -> BookieConfig:
    return make_config(tmp_path)


def _hold(storage: StreamStorage, stream_id: int, count: int) -> None:
    """Stores entries 0..count-1 of the stream (term 1): the first half flushed to the entry
    logs and the index, the rest left in the write cache."""
    half = count // 2
    flushed = [entry(stream_id, i) for i in range(half)]
    wait(storage.add_batch(add_request(stream_id, 1, flushed)).durable)
    flush(storage)
    cached = [entry(stream_id, i) for i in range(half, count)]
    wait(storage.add_batch(add_request(stream_id, 1, cached)).durable)


def _first(storage: StreamStorage, stream_id: int) -> int:
    state = storage.stream_state(stream_id)
    assert state is not None
    return state.first_entry_id


def _codes(storage: StreamStorage, stream_id: int, count: int) -> list[int]:
    return [storage.read(stream_id, i).code for i in range(count)]


def _firsts(storage: StreamStorage) -> dict[int, int]:
    return {s: _first(storage, s) for s in storage.stream_ids()}


def test_trims_below_metadata_and_drops_deleted_streams(
    session: MetadataSession, config: BookieConfig
) -> None:
    store = StreamStore(session)
    trimmed = build_stream(store, "trimmed", [(1, 1)] * 3, RetentionPolicy(max_bytes=1))
    _, version = store.get_stream_by_id(trimmed.id)
    store.trim_fragments(trimmed.id, version, [0, 10], 20)
    untouched = build_stream(store, "untouched", [(1, 1)] * 2)
    deleted = build_stream(store, "deleted", [(1, 1)] * 2)
    store.delete_stream("deleted")
    never_known = deleted.id + 100  # above the id counter: metadata never handed it out
    gone = deleted.id + 50  # trimmed away already, before this round
    storage, _ = open_storage(config)
    try:
        for stream_id in (trimmed.id, untouched.id, deleted.id, never_known, gone):
            _hold(storage, stream_id, 30)
        wait(storage.trim(gone, TRIM_ALL).durable)
        reconciler = MetadataReconciler(storage, session, interval_s=60)

        report = asyncio.run(reconciler.reconcile_once())
        assert _firsts(storage) == {
            trimmed.id: 20,
            untouched.id: 0,
            deleted.id: TRIM_ALL,
            never_known: 0,
            gone: TRIM_ALL,
        }
        assert (report.streams_checked, report.streams_trimmed, report.streams_deleted) == (
            4,  # not `gone`
            1,
            1,
        )
        assert _codes(storage, trimmed.id, 30) == [pb.TRIMMED] * 20 + [pb.OK] * 10
        assert _codes(storage, deleted.id, 30) == [pb.TRIMMED] * 30
        assert _codes(storage, untouched.id, 30) == [pb.OK] * 30
        assert _codes(storage, never_known, 30) == [pb.OK] * 30

        # Streams already trimmed away are not looked at again; nothing more to do.
        report = asyncio.run(reconciler.reconcile_once())
        assert (report.streams_trimmed, report.streams_deleted) == (0, 0)
        assert report.streams_checked == 3  # trimmed, untouched, never_known
        assert _firsts(storage)[trimmed.id] == 20

        # The trims went through the journal: a crash does not bring the entries back.
        storage, _ = crash_and_reopen(storage, config)
        assert _firsts(storage) == {
            trimmed.id: 20,
            untouched.id: 0,
            deleted.id: TRIM_ALL,
            never_known: 0,
            gone: TRIM_ALL,
        }
        assert _codes(storage, trimmed.id, 30) == [pb.TRIMMED] * 20 + [pb.OK] * 10
        assert _codes(storage, deleted.id, 30) == [pb.TRIMMED] * 30
    finally:
        storage.close()


def test_nothing_is_touched_when_metadata_cannot_be_read(
    session: MetadataSession, config: BookieConfig
) -> None:
    store = StreamStore(session)
    deleted = build_stream(store, "gone", [(1, 1)])
    store.delete_stream("gone")
    storage, _ = open_storage(config)
    try:
        _hold(storage, deleted.id, 10)
        session.close()  # every read now fails
        report = asyncio.run(MetadataReconciler(storage, session, interval_s=60).reconcile_once())
        assert report.skipped
        assert (report.streams_trimmed, report.streams_deleted) == (0, 0)
        assert _first(storage, deleted.id) == 0
        assert _codes(storage, deleted.id, 10) == [pb.OK] * 10
    finally:
        storage.close()


def test_a_round_is_bounded_and_continues_where_it_stopped(
    session: MetadataSession, config: BookieConfig
) -> None:
    store = StreamStore(session)
    ids = []
    for i in range(5):
        meta = build_stream(store, f"s{i}", [(1, 1)] * 2)
        _, version = store.get_stream_by_id(meta.id)
        store.trim_fragments(meta.id, version, [0], 10)
        ids.append(meta.id)
    storage, _ = open_storage(config)
    try:
        for stream_id in ids:
            _hold(storage, stream_id, 20)
        reconciler = MetadataReconciler(storage, session, interval_s=60, max_streams_per_round=2)
        rounds = []
        for _ in range(3):
            before = _firsts(storage)
            asyncio.run(reconciler.reconcile_once())
            after = _firsts(storage)
            rounds.append(sorted(s for s in after if after[s] != before[s]))
        assert rounds == [ids[0:2], ids[2:4], ids[4:5]]
        assert all(_first(storage, s) == 10 for s in ids)
    finally:
        storage.close()
