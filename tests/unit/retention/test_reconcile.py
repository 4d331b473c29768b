"""A bookie's reconciliation with metadata (stream/bookie/reconcile.py) against a real
ZooKeeper and an in-memory storage: it trims below metadata's first retained entry, trims a
deleted stream away, and leaves alone what metadata never knew or cannot tell."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from stream.bookie.reconcile import TRIM_ALL, MetadataReconciler
from stream.metadata import MetadataSession, RetentionPolicy, StreamStore
from tests.unit.retention.support import build_stream

pytestmark = pytest.mark.integration


@dataclass
class _State:
    first_entry_id: int


@dataclass
class _Outcome:
    code: int
    durable: None = None
    message: str = ""


@dataclass
class FakeStorage:
    """The part of StreamStorage the reconciler uses."""

    first: dict[int, int] = field(default_factory=dict)
    trims: list[tuple[int, int]] = field(default_factory=list)

    def stream_ids(self) -> list[int]:
        return list(self.first)

    def stream_state(self, stream_id: int) -> _State | None:
        first = self.first.get(stream_id)
        return None if first is None else _State(first)

    def trim(self, stream_id: int, before_entry_id: int) -> _Outcome:
        self.trims.append((stream_id, before_entry_id))
        self.first[stream_id] = max(self.first[stream_id], before_entry_id)
        return _Outcome(code=1)


def test_trims_below_metadata_and_drops_deleted_streams(session: MetadataSession) -> None:
    store = StreamStore(session)
    trimmed = build_stream(store, "trimmed", [(1, 1)] * 3, RetentionPolicy(max_bytes=1))
    _, version = store.get_stream_by_id(trimmed.id)
    store.trim_fragments(trimmed.id, version, [0, 10], 20)
    untouched = build_stream(store, "untouched", [(1, 1)] * 2)
    deleted = build_stream(store, "deleted", [(1, 1)] * 2)
    store.delete_stream("deleted")
    never_known = deleted.id + 100  # above the id counter: metadata never handed it out
    storage = FakeStorage(
        {trimmed.id: 0, untouched.id: 0, deleted.id: 0, never_known: 0, deleted.id + 50: TRIM_ALL}
    )
    reconciler = MetadataReconciler(storage, session, interval_s=60)

    report = asyncio.run(reconciler.reconcile_once())
    assert sorted(storage.trims) == [(trimmed.id, 20), (deleted.id, TRIM_ALL)]
    assert (report.streams_trimmed, report.streams_deleted) == (1, 1)
    # Streams already trimmed away are not looked at again; nothing more to do.
    storage.trims.clear()
    report = asyncio.run(reconciler.reconcile_once())
    assert storage.trims == []
    assert report.streams_checked == 3  # trimmed, untouched, never_known


def test_nothing_is_touched_when_metadata_cannot_be_read(session: MetadataSession) -> None:
    store = StreamStore(session)
    deleted = build_stream(store, "gone", [(1, 1)])
    store.delete_stream("gone")
    storage = FakeStorage({deleted.id: 0})
    session.close()  # every read now fails
    report = asyncio.run(MetadataReconciler(storage, session, interval_s=60).reconcile_once())
    assert report.skipped and storage.trims == []


def test_a_round_is_bounded_and_continues_where_it_stopped(session: MetadataSession) -> None:
    store = StreamStore(session)
    ids = []
    for i in range(5):
        meta = build_stream(store, f"s{i}", [(1, 1)] * 2)
        _, version = store.get_stream_by_id(meta.id)
        store.trim_fragments(meta.id, version, [0], 10)
        ids.append(meta.id)
    storage = FakeStorage(dict.fromkeys(ids, 0))
    reconciler = MetadataReconciler(storage, session, interval_s=60, max_streams_per_round=2)
    rounds = []
    for _ in range(3):
        storage.trims.clear()
        asyncio.run(reconciler.reconcile_once())
        rounds.append(sorted(s for s, _ in storage.trims))
    assert rounds == [ids[0:2], ids[2:4], ids[4:5]]
