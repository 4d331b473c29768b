"""BP-46 data integrity on the real storage engine: when phase one runs, what it makes durable,
every limbo answer, the repair's storage primitives (what is missing, storing copies), and the
planning of phase two (fixed end, spans and ids to hold)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from stream.autorecovery.phase_two import HoldSpan, fixed_end, ids_to_hold, spans_to_hold
from stream.bookie import integrity
from stream.bookie.integrity import limbo_bounds, phase_one_reason, run_phase_one
from stream.bookie.unsafe import UnsafeSkips
from stream.metadata.model import Fragment, StreamMeta, StreamState
from stream.wire import bookie_pb2 as pb

from .storage_support import (
    add_request,
    crash_and_reopen,
    entry,
    flush,
    make_config,
    open_storage,
    wait,
)


def meta(**overrides: object) -> StreamMeta:
    fields: dict[str, object] = {
        "name": "s",
        "id": 7,
        "ensemble": 3,
        "write_quorum": 3,
        "ack_quorum": 2,
        "fragment_max_entries": 1000,
        "fragment_max_bytes": 1 << 20,
        "term": 3,
        "term_history": ((1, 0), (3, 40)),
    }
    fields.update(overrides)
    return StreamMeta(**fields)  # type: ignore[arg-type]


def frag(first: int, *ensemble: str, last: int | None = None) -> Fragment:
    return Fragment(first, tuple(ensemble), last_entry_id=last)


# -- when phase one runs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("unclean", "bypassed", "cookie", "expected"),
    [
        (False, False, False, None),
        (False, True, False, None),  # a clean shutdown flushed everything
        (True, False, False, None),  # a crash with every entry in the journal loses none
        (True, True, False, "unclean_shutdown"),
        (False, False, True, "cookie"),
        (True, True, True, "cookie"),
    ],
)
def test_phase_one_reason(unclean: bool, bypassed: bool, cookie: bool, expected: str | None):
    assert (
        phase_one_reason(unclean=unclean, journal_bypassed=bypassed, cookie_fix=cookie) == expected
    )


def test_journal_bypass_marker_lives_until_a_journaled_run(tmp_path: Path) -> None:
    journaled = make_config(tmp_path, journal_write_data=True)
    bypassing = make_config(tmp_path, journal_write_data=False)
    marker = journaled.index_path / integrity.JOURNAL_BYPASS_MARKER
    assert not integrity.note_journal_mode(journaled)
    assert not marker.exists()
    # First run without the journal: nothing before it bypassed, but from now on it is marked.
    assert not integrity.note_journal_mode(bypassing)
    assert marker.exists()
    assert integrity.note_journal_mode(bypassing)
    integrity.settle_journal_mode(bypassing)
    assert marker.exists()
    # A run with the journal still sees the previous run's bypass, and settles it afterwards.
    assert integrity.note_journal_mode(journaled)
    integrity.settle_journal_mode(journaled)
    assert not marker.exists()
    assert not integrity.note_journal_mode(journaled)


# -- phase one on the real storage ------------------------------------------------------------


def test_phase_one_fences_terms_and_sets_limbo_durably(tmp_path: Path) -> None:
    config = make_config(tmp_path, journal_write_data=False)
    storage, _ = open_storage(config)
    wait(storage.add_batch(add_request(7, 5, [entry(7, 0)])).durable)  # local term above meta
    wait(storage.add_batch(add_request(8, 1, [entry(8, 0), entry(8, 1)])).durable)
    streams = [
        (meta(id=7, term=3), [frag(0, "b1", "b2", "b3")]),
        (meta(id=8, term=4, term_history=((1, 0), (4, 2))), [frag(0, "b1", "b2", "b3")]),
        (meta(id=9, term=2, term_history=((2, 0),)), [frag(0, "b1", "b2", "b3")]),  # unseen
    ]
    report = asyncio.run(run_phase_one(storage, streams, reason="unclean_shutdown"))
    assert report.stream_ids == (7, 8, 9) and report.limbo
    # Durable before serving: a crash right after keeps every term and limbo.
    storage, _ = crash_and_reopen(storage, config)
    try:
        terms = {
            sid: (storage.stream_state(sid).term, storage.stream_state(sid).limbo)
            for sid in (7, 8, 9)
        }
        assert terms == {7: (5, True), 8: (4, True), 9: (2, True)}
        assert limbo_bounds(storage) == {7: 5, 8: 4, 9: 2}
        # Scenario 1: the writer of the older term 1 is refused on stream 8 (term 4 fenced).
        assert storage.add_batch(add_request(8, 1, [entry(8, 2)])).codes == [pb.INVALID_TERM]
    finally:
        storage.close()


def test_unsafe_switch_skips_limbo(tmp_path: Path) -> None:
    storage, _ = open_storage(make_config(tmp_path))
    try:
        no_limbo = UnsafeSkips(frozenset({"limbo"}))
        asyncio.run(run_phase_one(storage, [(meta(), [])], reason="cookie", unsafe=no_limbo))
        state = storage.stream_state(7)
        assert (state.term, state.limbo) == (3, False)
        no_phase_one = UnsafeSkips(frozenset({"phase_one"}))
        report = asyncio.run(
            run_phase_one(storage, [(meta(id=8), [])], reason="cookie", unsafe=no_phase_one)
        )
        assert report.stream_ids == () and storage.stream_state(8) is None
    finally:
        storage.close()


def test_limbo_answers_unknown_on_every_negative_path(tmp_path: Path) -> None:
    storage, _ = open_storage(make_config(tmp_path, journal_write_data=False))
    try:
        wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(3)], lac=2)).durable)
        streams = [(meta(id=7, term=2, term_history=((2, 0),)), []), (meta(id=9), [])]
        asyncio.run(run_phase_one(storage, streams, reason="unclean_shutdown"))
        # Stream 9 is known only from the metadata: not NO_SUCH_STREAM, but UNKNOWN.
        for sid, eid in ((7, 5), (9, 0)):
            assert storage.read(sid, eid).code == pb.UNKNOWN
            assert storage.read(sid, eid, term=3).code == pb.UNKNOWN  # a recovery read
            assert list(storage.read_range(sid, eid, eid + 3, 0))[-1][0] == pb.UNKNOWN
        fence = storage.fence(9, 4)
        assert (fence.code, fence.limbo) == (pb.OK, True)
        # Positives as usual; the term rule still holds for recovery reads.
        assert storage.read(7, 1).code == pb.OK
        assert storage.read(7, 1, term=1).code == pb.INVALID_TERM
        assert [c for c, _ in storage.read_range(7, 0, 2, 0)] == [pb.OK]
        assert storage.read(12, 0).code == pb.NO_SUCH_STREAM  # not in the metadata: unknown
        wait(storage.set_limbo(7, False))
        assert storage.read(7, 5).code == pb.NO_SUCH_ENTRY
    finally:
        storage.close()


# -- the repair's storage primitives --------------------------------------------------------


def test_missing_entry_ids_looks_at_caches_and_index(tmp_path: Path) -> None:
    storage, _ = open_storage(make_config(tmp_path, journal_write_data=False))
    try:
        wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(0, 10, 2)])).durable)
        flush(storage)  # 0, 2, 4, 6, 8 in the index
        wait(storage.add_batch(add_request(7, 1, [entry(7, 11)])).durable)  # in the cache
        wanted = list(range(0, 13))
        assert storage.missing_entry_ids(7, wanted) == [1, 3, 5, 7, 9, 10, 12]
        wait(storage.trim(7, 4).durable)
        assert storage.missing_entry_ids(7, wanted) == [5, 7, 9, 10, 12]
        assert storage.missing_entry_ids(8, [0, 1]) == [0, 1]
        assert storage.missing_entry_ids(7, []) == []
    finally:
        storage.close()


def test_store_copies_fills_gaps_without_truncating(tmp_path: Path) -> None:
    config = make_config(tmp_path, journal_write_data=False)
    storage, _ = open_storage(config)
    wait(storage.add_batch(add_request(7, 2, [entry(7, i) for i in (0, 1, 5, 6)])).durable)
    flush(storage)
    wait(storage.set_limbo(7, True))
    noop = entry(7, 3, b"", flags=pb.NOOP | pb.TRUNCATE)
    bad = entry(7, 4)
    bad.crc32c ^= 1
    other = entry(7, 1, b"a different value")  # held already: never overwritten
    stored = storage.store_copies(7, [entry(7, 2), noop, bad, other])
    assert stored == 2
    # The old no-op deleted nothing above it (5 and 6 may be newer, legitimate entries).
    assert [storage.read(7, i).code for i in range(7)] == [
        pb.OK,
        pb.OK,
        pb.OK,
        pb.OK,
        pb.UNKNOWN,
        pb.OK,
        pb.OK,
    ]
    assert storage.read(7, 1).entry == entry(7, 1)
    assert storage.missing_entry_ids(7, list(range(7))) == [4]
    # Copies skip the journal: only a flush makes them durable (the repair flushes, then
    # clears limbo, so a crash before that repeats the repair).
    storage, _ = crash_and_reopen(storage, config)
    assert storage.missing_entry_ids(7, list(range(7))) == [2, 3, 4]
    assert storage.store_copies(7, [entry(7, 2), entry(7, 4)]) == 2
    flush(storage)
    storage, _ = crash_and_reopen(storage, config)
    try:
        assert storage.missing_entry_ids(7, list(range(7))) == [3]
        assert storage.stream_state(7).limbo
        assert storage.store_copies(99, [entry(99, 0)]) == 0  # unknown stream: nothing
    finally:
        storage.close()


# -- phase two planning ---------------------------------------------------------------------


def test_fixed_end_after_a_newer_term_recovered() -> None:
    fragments = [frag(0, "b1", "b2", "b3")]
    m = meta(term=5, term_history=((1, 0), (3, 40), (5, 90)))
    # Lost entries came from terms <= the bound; the first newer term started at its no-op.
    assert fixed_end(m, fragments, "b1", bound_term=3) == 89
    assert fixed_end(m, fragments, "b1", bound_term=2) == 39
    assert fixed_end(m, fragments, "b1", bound_term=5) is None  # a recovery must run first


def test_fixed_end_when_not_in_the_last_fragment() -> None:
    fragments = [frag(0, "b1", "b2", "b3"), frag(70, "b4", "b2", "b3")]
    assert fixed_end(meta(), fragments, "b1", bound_term=3) == 69
    assert fixed_end(meta(), fragments, "b2", bound_term=3) is None


def test_fixed_end_of_a_sealed_stream() -> None:
    sealed = meta(state=StreamState.SEALED, term=4, term_history=((1, 0), (4, 120)))
    assert fixed_end(sealed, [frag(0, "b1", "b2", "b3")], "b1", bound_term=9) == 119
    empty = meta(state=StreamState.SEALED, term=1, term_history=())
    assert fixed_end(empty, [], "b1", bound_term=1) == -1


def test_spans_and_ids_to_hold_follow_write_sets_and_retention() -> None:
    m = meta(ensemble=3, write_quorum=2, ack_quorum=2, first_entry_id=4)
    fragments = [
        frag(0, "b1", "b2", "b3", last=9),
        frag(10, "b4", "b2", "b3"),
        frag(20, "b1", "b4", "b5"),
    ]
    spans = spans_to_hold(m, fragments, "b1", last_entry_id=25)
    assert spans == [HoldSpan(4, 9, ("b1", "b2", "b3")), HoldSpan(20, 25, ("b1", "b4", "b5"))]
    # b1 is index 0: it holds e when (0 - e) % 3 < 2, i.e. e % 3 in (0, 2).
    assert [i for ids in ids_to_hold(m, spans[0], "b1") for i in ids] == [5, 6, 8, 9]
    assert [i for ids in ids_to_hold(m, spans[1], "b1") for i in ids] == [20, 21, 23, 24]
    assert spans_to_hold(m, fragments, "b1", last_entry_id=3) == []
    assert spans_to_hold(m, fragments, "b9", last_entry_id=25) == []


def test_ids_to_hold_come_in_bounded_windows() -> None:
    m = meta()
    windows = list(ids_to_hold(m, HoldSpan(0, 200_000, ("b1", "b2", "b3")), "b2"))
    assert all(len(w) <= 65_536 for w in windows)
    flat = [i for w in windows for i in w]
    assert flat == list(range(200_001))


def test_a_truncate_noop_survives_a_crash_without_the_journal(tmp_path: Path) -> None:
    # The no-op overwrites an older, unacknowledged value at its id that a flush already put
    # in an entry log. Losing the no-op in a crash would bring that value back as a positive
    # answer (served even in limbo): the no-op itself goes through the journal.
    config = make_config(tmp_path, journal_write_data=False)
    storage, _ = open_storage(config)
    wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(8)])).durable)
    flush(storage)
    noop = entry(7, 5, b"", flags=pb.NOOP | pb.TRUNCATE)
    wait(storage.add_batch(add_request(7, 2, [noop])).durable)
    wait(storage.add_batch(add_request(7, 2, [entry(7, 6, b"new")])).durable)
    storage, _ = crash_and_reopen(storage, config)
    try:
        assert storage.read(7, 5).entry == noop
        assert storage.read(7, 6).code == pb.NO_SUCH_ENTRY  # lost: limbo and repair's job
        assert storage.read(7, 7).code == pb.NO_SUCH_ENTRY  # truncated for good
        assert storage.stream_state(7).term == 2
    finally:
        storage.close()


def test_a_recovery_write_back_survives_a_crash_without_the_journal(tmp_path: Path) -> None:
    # A recovery writes back the committed value over an earlier term's no-op that a flush
    # already put in an entry log (found by the 20-round kill -9 test: the no-op came back and
    # the bookie diverged from its write set). The write-back goes through the journal.
    config = make_config(tmp_path, journal_write_data=False)
    storage, _ = open_storage(config)
    stale = entry(7, 5, b"", flags=pb.NOOP | pb.TRUNCATE)
    wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(5)] + [stale])).durable)
    flush(storage)
    committed = entry(7, 5, b"committed")
    later = entry(7, 6, b"later")
    wait(storage.add_batch(add_request(7, 2, [committed], recovery=True)).durable)
    wait(storage.add_batch(add_request(7, 2, [later])).durable)
    storage, _ = crash_and_reopen(storage, config)
    try:
        assert storage.read(7, 5).entry == committed
        assert storage.read(7, 6).code == pb.NO_SUCH_ENTRY  # an ordinary add: lost, as allowed
    finally:
        storage.close()
