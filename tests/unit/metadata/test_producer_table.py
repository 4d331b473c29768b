"""The producer table and the producer term in a stream's meta: JSON round trips and checks
(pure), and the takeover's and the roll's folds on a real ZooKeeper."""

from __future__ import annotations

import json

import pytest

from stream.errors import InvalidArgumentError, MetadataError
from stream.metadata import (
    Fragment,
    MetadataSession,
    ProducerChange,
    ProducerTerm,
    StreamMeta,
    StreamStore,
)
from stream.protocol.producers import MAX_PRODUCERS, ProducerPosition

E3 = ("b1", "b2", "b3")
DAY_MS = 86_400_000


def _meta(**changes: object) -> StreamMeta:
    base = StreamMeta("orders", 7, 3, 3, 2, 100, 1 << 20, term=4)
    return base.replace(**changes)


def test_meta_without_producers_keeps_its_bytes() -> None:
    body = json.loads(_meta().to_json())
    assert "producers" not in body and "producer_term" not in body


def test_round_trip() -> None:
    meta = _meta(
        producers=(ProducerPosition("a", 3, 30, 1), ProducerPosition("b", 0, 31, 2)),
        producer_term=ProducerTerm(4, "a", 32),
    )
    assert StreamMeta.from_json(meta.to_json()) == meta


@pytest.mark.parametrize(
    "producers",
    [
        (ProducerPosition("b", 1, 1, 1), ProducerPosition("a", 1, 1, 1)),  # not sorted
        (ProducerPosition("a", 1, 1, 1), ProducerPosition("a", 2, 2, 2)),  # twice
        tuple(ProducerPosition(f"p{i:04d}", 0, 0, 0) for i in range(MAX_PRODUCERS + 1)),
    ],
)
def test_bad_tables_are_refused(producers: tuple[ProducerPosition, ...]) -> None:
    with pytest.raises(InvalidArgumentError):
        _meta(producers=producers)


@pytest.mark.parametrize(
    "bad",
    [
        {"producers": {"a": 1}},
        {"producers": [{"producer_id": "a", "last_sequence": -2, "last_entry_id": 0}]},
        {"producers": [{"producer_id": "", "last_sequence": 0, "last_entry_id": 0}]},
        {"producer_term": {"term": 1, "producer_id": "a"}},
        {"producer_term": [1, "a", 0]},
    ],
)
def test_malformed_znodes_are_metadata_errors(bad: dict[str, object]) -> None:
    body = json.loads(_meta().to_json())
    body.update(bad)
    with pytest.raises(MetadataError):
        StreamMeta.from_json(json.dumps(body).encode())


def test_bad_producer_ids_and_changes() -> None:
    with pytest.raises(InvalidArgumentError):
        ProducerTerm(1, "x" * 256, 0)
    with pytest.raises(InvalidArgumentError):
        ProducerChange(expiry_ms=0)
    with pytest.raises(InvalidArgumentError):
        ProducerChange(positions=(ProducerPosition("a", -5, 0, 0),))


@pytest.fixture
def store(session: MetadataSession) -> StreamStore:
    return StreamStore(session, clock_ms=lambda: 1_000)


@pytest.mark.integration
def test_takeovers_and_rolls_fold_the_table(store: StreamStore) -> None:
    meta = store.create_stream(
        "orders",
        ensemble=3,
        write_quorum=3,
        ack_quorum=2,
        fragment_max_entries=100,
        fragment_max_bytes=1 << 20,
    )
    _, version = store.get_stream_by_id(meta.id)
    taken, version, _ = store.begin_takeover(meta.id, version)
    # Term 1 is producer "a"'s.
    opened, version = store.finish_recovery(
        meta.id,
        version,
        taken.term,
        [],
        [Fragment(0, E3)],
        0,
        ProducerChange(now_ms=0, producer_term=ProducerTerm(taken.term, "a", 0)),
    )
    assert opened.producer_term == ProducerTerm(1, "a", 0) and opened.producers == ()
    # Its roll records where "a" stood at the end of the closed fragment.
    rolled, version = store.roll_fragment(
        meta.id,
        version,
        Fragment(0, E3, last_entry_id=9),
        Fragment(10, E3),
        ProducerChange(
            (ProducerPosition("a", 9, 9, 5),), now_ms=5, producer_term=ProducerTerm(1, "a", 10)
        ),
    )
    assert rolled.producers == (ProducerPosition("a", 9, 9, 5),)
    assert rolled.producer_term == ProducerTerm(1, "a", 10)
    # A plain takeover that learned nothing leaves both as they were.
    taken, version, _ = store.begin_takeover(meta.id, version)
    plain, version = store.finish_recovery(meta.id, version, taken.term, [], [], 12)
    assert plain.producer_term == ProducerTerm(1, "a", 10)
    # A producer "b" takeover eight days later: "a"'s tail is folded in, then expires.
    taken, version, _ = store.begin_takeover(meta.id, version)
    later = 8 * DAY_MS
    b_opened, version = store.finish_recovery(
        meta.id,
        version,
        taken.term,
        [],
        [],
        13,
        ProducerChange(
            (ProducerPosition("a", 11, 11, later - DAY_MS),),
            now_ms=later,
            producer_term=ProducerTerm(taken.term, "b", 13),
        ),
    )
    assert b_opened.producers == (ProducerPosition("a", 11, 11, later - DAY_MS),)
    assert b_opened.producer_term == ProducerTerm(3, "b", 13)
    assert store.get_stream_by_id(meta.id)[0] == b_opened
    taken, version, _ = store.begin_takeover(meta.id, version)
    expired, _ = store.finish_recovery(
        meta.id, version, taken.term, [], [], 14, ProducerChange(now_ms=later + 7 * DAY_MS)
    )
    assert expired.producers == () and expired.producer_term is None
