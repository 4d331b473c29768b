"""The idempotent producer's rules: sequence decisions exhaustively over small sequences and
epochs (against an oracle written from the documented rule), the recovered position, and the
producer table's folding, expiry and bound."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from stream.protocol.producers import (
    EPOCH_BITS,
    MAX_SEQUENCE,
    NO_SEQUENCE,
    UNKNOWN_ENTRY_ID,
    ProducerPosition,
    SequenceDecision,
    TailAnchor,
    decide_sequence,
    duplicate_entry_id,
    find_producer,
    fold_producers,
    recovered_position,
)

D = SequenceDecision


def seq(epoch: int, position: int) -> int:
    return epoch << EPOCH_BITS | position


# Small sequences in epochs 0-2: positions 0-3 and the last positions of an epoch.
POSITIONS = (0, 1, 2, 3, (1 << EPOCH_BITS) - 2, (1 << EPOCH_BITS) - 1)
SMALL = sorted({seq(e, p) for e in range(3) for p in POSITIONS})


def allowed_after(last: int) -> set[int]:
    """The oracle's successors of `last` among SMALL: one more, or any epoch start above."""
    return {s for s in SMALL if s == last + 1 or (s % (1 << EPOCH_BITS) == 0 and s > last)} - {
        s for s in SMALL if s <= last
    }


def oracle(n: int, recovered: int, session: int | None) -> SequenceDecision:
    if session is None:
        if recovered == NO_SEQUENCE:
            return D.WRITE
        if n <= recovered:
            return D.DUPLICATE
        return D.WRITE if n in allowed_after(recovered) else D.GAP
    if n <= session:
        return D.STEP_BACK
    if n not in allowed_after(session):
        return D.GAP
    return D.DUPLICATE if n <= recovered else D.WRITE


def test_exhaustive_small_sequences() -> None:
    for recovered in [NO_SEQUENCE, *SMALL]:
        for session in [None, *SMALL]:
            for n in SMALL:
                assert decide_sequence(n, recovered, session) is oracle(n, recovered, session), (
                    n,
                    recovered,
                    session,
                )


def test_out_of_range_is_refused_in_every_state() -> None:
    for recovered, session in itertools.product([NO_SEQUENCE, 0, 5], [None, 0, 5]):
        for n in (-1, -(2**63), MAX_SEQUENCE + 1):
            decision = decide_sequence(n, recovered, session)
            assert decision is D.OUT_OF_RANGE and decision.refused


def test_restart_from_the_start_replays_then_writes() -> None:
    """A producer that re-runs 0..9 after 0..5 were durable: six duplicates, then writes."""
    session = None
    decisions = []
    for n in range(10):
        decisions.append(decide_sequence(n, 5, session))
        session = n
    assert decisions == [D.DUPLICATE] * 6 + [D.WRITE] * 4


def test_sink_batches_replay_and_move_on() -> None:
    """Batch 7 half written (rows 0-2 of 6): its replay skips them; batch 8 starts an epoch."""
    recovered = seq(7, 2)
    session = None
    out = []
    for n in [seq(7, r) for r in range(6)] + [seq(8, r) for r in range(2)]:
        out.append(decide_sequence(n, recovered, session))
        session = n
    assert out == [D.DUPLICATE] * 3 + [D.WRITE] * 5
    # The next batch straight after a restart (batch 7 was complete) is allowed too.
    assert decide_sequence(seq(8, 0), seq(7, 5), None) is D.WRITE
    # A batch that skips rows is not.
    assert decide_sequence(seq(8, 1), seq(7, 5), None) is D.GAP


@given(
    st.integers(NO_SEQUENCE, MAX_SEQUENCE),
    st.one_of(st.none(), st.integers(0, MAX_SEQUENCE)),
    st.integers(0, MAX_SEQUENCE),
)
def test_large_sequences(recovered: int, session: int | None, n: int) -> None:
    decision = decide_sequence(n, recovered, session)
    if decision is D.WRITE:
        assert n > recovered or recovered == NO_SEQUENCE
    if decision is D.DUPLICATE:
        assert n <= recovered
    if session is not None and n <= session:
        assert decision is D.STEP_BACK
    if session is not None and n == session + 1:
        assert not decision.refused


def test_recovered_position_from_table_and_tail() -> None:
    record = ProducerPosition("p1", 9, 100, 5)
    assert recovered_position("p1", None, None) == (NO_SEQUENCE, ())
    assert recovered_position("p1", record, None) == (9, (TailAnchor(9, 100, 100),))
    tail = TailAnchor(11, 121, 119)
    assert recovered_position("p1", record, tail) == (11, (TailAnchor(9, 100, 100), tail))
    # Another producer's record counts for nothing.
    assert recovered_position("p2", record, TailAnchor(0, 130, 125)) == (
        0,
        (TailAnchor(0, 130, 125),),
    )


def test_duplicate_entry_ids() -> None:
    # The run 119..121 holds sequences 9, 10, 11 (epoch 0); the table knows 4 at 90.
    anchors = (TailAnchor(4, 90, 90), TailAnchor(11, 121, 119))
    found = {n: duplicate_entry_id(n, anchors) for n in range(13)}
    assert found == {
        **dict.fromkeys(range(13), UNKNOWN_ENTRY_ID),
        4: 90,
        9: 119,
        10: 120,
        11: 121,
    }
    # A run that crossed into a new epoch knows only that epoch's sequences.
    epoch = seq(3, 0)
    anchor = TailAnchor(epoch + 1, 50, 40)
    assert duplicate_entry_id(epoch, [anchor]) == 49
    assert duplicate_entry_id(epoch - 1, [anchor]) == UNKNOWN_ENTRY_ID


def test_fold_moves_up_and_keeps_later_use() -> None:
    table = (ProducerPosition("a", 5, 50, 1_000), ProducerPosition("b", 1, 10, 1_000))
    folded = fold_producers(
        table,
        [ProducerPosition("a", 7, 70, 2_000), ProducerPosition("b", 0, 5, 3_000)],
        now_ms=3_000,
    )
    assert folded == (ProducerPosition("a", 7, 70, 2_000), ProducerPosition("b", 1, 10, 1_000))
    assert find_producer(folded, "a") == ProducerPosition("a", 7, 70, 2_000)
    assert find_producer(folded, "c") is None


def test_fold_expires_and_bounds() -> None:
    table = [ProducerPosition(f"p{i}", i, i, i * 10) for i in range(10)]
    folded = fold_producers(table, [], now_ms=100, expiry_ms=50)
    assert [p.producer_id for p in folded] == ["p5", "p6", "p7", "p8", "p9"]
    bounded = fold_producers(table, [], now_ms=100, expiry_ms=1_000, max_producers=3)
    assert [p.producer_id for p in bounded] == ["p7", "p8", "p9"]
    # Order of the input does not matter: equal tables, equal results.
    assert fold_producers(reversed(table), [], now_ms=100, expiry_ms=1_000) == fold_producers(
        table, [], now_ms=100, expiry_ms=1_000
    )
