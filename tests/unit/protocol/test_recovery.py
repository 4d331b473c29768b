"""Recovery decisions: fencing, recovery reads and the end scan, exhaustively for small
configurations against brute-force oracles, plus the scenarios from the references."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from itertools import combinations, product

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream.errors import InvalidArgumentError
from stream.protocol.codes import Code, limbo_code
from stream.protocol.invariant import InvariantViolation
from stream.protocol.quorum import QuorumConfig
from stream.protocol.recovery import (
    FenceOutcome,
    FenceTally,
    ReadOutcome,
    RecoveryReadTally,
    RecoveryStatus,
    read_outcome,
    scan_recovery_reads,
)

POS, NEG, UNK, MISSING = "pos", "neg", "unk", "missing"
# Non-positive fence answers cycle through these codes (None is a timeout).
FENCE_NON_POSITIVE = [
    Code.NO_SUCH_STREAM,
    Code.UNKNOWN,
    None,
    Code.INVALID_TERM,
    Code.TOO_BUSY,
    Code.CODE_UNSPECIFIED,
    Code.NO_SUCH_ENTRY,
]
READ_NEGATIVE = [Code.NO_SUCH_ENTRY, Code.NO_SUCH_STREAM]
READ_UNKNOWN = [Code.UNKNOWN, None, Code.INVALID_TERM, Code.TRIMMED, Code.INTERNAL, Code(0)]


def configs(max_e: int) -> Iterator[QuorumConfig]:
    for e in range(1, max_e + 1):
        for wq in range(1, e + 1):
            for aq in range(1, wq + 1):
                yield QuorumConfig(e, wq, aq)


# --- fencing ----------------------------------------------------------------------------------


def fence_oracle(config: QuorumConfig, answered: list[tuple[int, str]]) -> tuple[FenceOutcome, int]:
    """Replay answers (index, POS/UNK) one by one; return the first decisive outcome and how
    many answers had been counted when it was reached. Brute force over ack quorums."""
    e, aq = config.ensemble, config.ack_quorum
    positives: set[int] = set()
    unknowns: set[int] = set()
    for count, (index, kind) in enumerate(answered, start=1):
        (positives if kind == POS else unknowns).add(index)
        # Complete: no ack quorum of the ensemble is made only of non-positive members.
        if not any(all(m not in positives for m in q) for q in combinations(range(e), aq)):
            return FenceOutcome.COMPLETE, count
        # Failed: even if every silent member answers OK, some ack quorum is all unknown.
        if any(True for _ in combinations(sorted(unknowns), aq)):
            return FenceOutcome.FAILED, count
    return FenceOutcome.PENDING, len(answered)


@pytest.mark.parametrize("ensemble", range(1, 7))
def test_fence_tally_exhaustive(ensemble: int) -> None:
    for config in configs(ensemble):
        if config.ensemble != ensemble:
            continue
        for kinds in product((POS, UNK, MISSING), repeat=ensemble):
            for order in (range(ensemble), reversed(range(ensemble))):
                answered = [(i, kinds[i]) for i in order if kinds[i] != MISSING]
                expected, decisive = fence_oracle(config, answered)
                tally = FenceTally(config, last_fragment_first_entry_id=10)
                for index, kind in answered:
                    if kind == POS:
                        # lac >= lafr as on a real bookie; values vary by index.
                        lafr = (index * 5) % 17 - 1
                        tally.on_response(index, Code.OK, lac=lafr + index, lafr=lafr)
                    else:
                        code = FENCE_NON_POSITIVE[index % len(FENCE_NON_POSITIVE)]
                        tally.on_response(index, code, lac=99, lafr=99)
                assert tally.outcome is expected, (config, answered)
                counted = [i for i, kind in answered[:decisive] if kind == POS]
                assert tally.positives == len(counted)
                if expected is FenceOutcome.COMPLETE:
                    lafrs = [(i * 5) % 17 - 1 for i in counted]
                    assert tally.start_entry_id == max([*lafrs, 9])
                    assert tally.frozen_lac == max(
                        lafr + i for i, lafr in zip(counted, lafrs, strict=True)
                    )
                    assert tally.positives == config.ensemble_coverage
                if expected is FenceOutcome.FAILED:
                    assert tally.unknowns == config.ack_quorum


def test_fence_start_uses_lafr_not_lac() -> None:
    tally = FenceTally(QuorumConfig(3, 3, 2), last_fragment_first_entry_id=0)
    assert tally.on_response(0, Code.OK, lac=20, lafr=4) is FenceOutcome.PENDING
    assert tally.on_response(2, Code.OK, lac=18, lafr=6) is FenceOutcome.COMPLETE
    assert tally.start_entry_id == 6
    assert tally.frozen_lac == 20
    # Decided: later answers change nothing.
    assert tally.on_response(1, Code.OK, lac=30, lafr=30) is FenceOutcome.COMPLETE
    assert (tally.start_entry_id, tally.frozen_lac, tally.positives) == (6, 20, 2)


def test_fence_start_is_never_before_the_last_fragment() -> None:
    tally = FenceTally(QuorumConfig(3, 2, 2), last_fragment_first_entry_id=50)
    tally.on_response(0, Code.OK, lac=-1, lafr=-1)
    tally.on_response(1, Code.OK, lac=-1, lafr=-1)
    assert tally.outcome is FenceOutcome.COMPLETE
    assert tally.start_entry_id == 49


def test_fence_counts_first_answer_per_bookie_and_flags_invalid_term() -> None:
    tally = FenceTally(QuorumConfig(3, 3, 2), last_fragment_first_entry_id=0)
    tally.on_response(0, Code.INVALID_TERM)
    assert tally.invalid_term_seen
    tally.on_response(0, Code.OK)  # a retry's answer belongs to a new attempt
    assert (tally.positives, tally.unknowns) == (0, 1)
    assert tally.on_response(1, None) is FenceOutcome.FAILED


def test_fence_rejects_foreign_index_and_premature_reads() -> None:
    tally = FenceTally(QuorumConfig(3, 3, 2), last_fragment_first_entry_id=0)
    with pytest.raises(InvariantViolation):
        tally.on_response(3, Code.OK)
    with pytest.raises(InvariantViolation):
        _ = tally.start_entry_id
    with pytest.raises(InvariantViolation):
        _ = tally.frozen_lac
    with pytest.raises(InvalidArgumentError):
        FenceTally(QuorumConfig(3, 3, 2), last_fragment_first_entry_id=-1)


# --- recovery reads ---------------------------------------------------------------------------


@cache
def read_oracle(wq: int, aq: int, required: int, answers: tuple[str, ...]) -> ReadOutcome:
    """The outcome for one snapshot of answers (MISSING: not answered yet), by brute force:
    ack quorums by enumeration, reachability by enumerating every completion."""

    def decided(snapshot: tuple[str, ...]) -> ReadOutcome | None:
        positives = snapshot.count(POS)
        if positives >= required:
            return ReadOutcome.RECOVERABLE
        # Ended: every ack quorum of the write set holds an explicit negative, so no ack
        # quorum can hold the entry.
        if all(any(snapshot[m] == NEG for m in q) for q in combinations(range(wq), aq)):
            return ReadOutcome.ENDED
        return None

    now = decided(answers)
    if now is not None:
        return now
    silent = [i for i, a in enumerate(answers) if a == MISSING]
    for completion in product((POS, NEG, UNK), repeat=len(silent)):
        filled = list(answers)
        for i, a in zip(silent, completion, strict=True):
            filled[i] = a
        if decided(tuple(filled)) is not None:
            return ReadOutcome.PENDING
    return ReadOutcome.UNKNOWN


@pytest.mark.parametrize("wq", range(1, 6))
def test_recovery_read_tally_exhaustive(wq: int) -> None:
    for aq in range(1, wq + 1):
        # E > WQ so the write set is a proper, wrapped subset of the ensemble.
        config = QuorumConfig(wq + 1, wq, aq)
        write_set = config.write_set(config.ensemble - 1)
        for required in sorted({1, aq}):
            for kinds in product((POS, NEG, UNK, MISSING), repeat=wq):
                for order in (range(wq), reversed(range(wq))):
                    check_read_sequence(config, write_set, required, kinds, list(order))


def check_read_sequence(
    config: QuorumConfig,
    write_set: tuple[int, ...],
    required: int,
    kinds: tuple[str, ...],
    order: list[int],
) -> None:
    wq, aq = config.write_quorum, config.ack_quorum
    tally: RecoveryReadTally[int, str] = RecoveryReadTally(
        config, write_set, positives_required=required
    )
    snapshot = [MISSING] * wq
    expected = ReadOutcome.PENDING
    first_positive: str | None = None
    for position in order:
        kind = kinds[position]
        if kind == MISSING:
            continue
        member = write_set[position]
        if expected is ReadOutcome.PENDING:
            snapshot[position] = kind
            expected = read_oracle(wq, aq, required, tuple(snapshot))
            if kind == POS and first_positive is None:
                first_positive = f"entry-from-{member}"
        if kind == POS:
            outcome = tally.on_response(member, Code.OK, f"entry-from-{member}")
        elif kind == NEG:
            outcome = tally.on_response(member, READ_NEGATIVE[member % 2])
        else:
            outcome = tally.on_response(member, READ_UNKNOWN[member % len(READ_UNKNOWN)])
        assert outcome is expected, (config, required, kinds, order)
    assert tally.outcome is expected
    positives, negatives, _ = tally.counts
    if expected is ReadOutcome.RECOVERABLE:
        assert positives >= required
        assert tally.entry == first_positive
    if expected is ReadOutcome.ENDED:
        assert negatives >= config.quorum_coverage
        assert positives < required
        if required == 1:
            assert positives == 0


def test_read_outcome_thresholds_are_disjoint_with_aq_positives() -> None:
    for config in configs(6):
        aq, wq = config.ack_quorum, config.write_quorum
        for positives in range(wq + 1):
            for negatives in range(wq + 1 - positives):
                recoverable = positives >= aq
                ended = negatives >= config.quorum_coverage
                assert not (recoverable and ended)
                outcome = read_outcome(
                    config, positives, negatives, wq - positives - negatives, positives_required=aq
                )
                assert outcome is not ReadOutcome.PENDING  # all answered: decided


@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),
            st.sampled_from([*Code, None]),
        ),
        max_size=6,
    )
)
def test_any_code_sequence_is_classified_safely(answers: list[tuple[int, Code | None]]) -> None:
    config = QuorumConfig(3, 3, 2)
    tally: RecoveryReadTally[int, bytes] = RecoveryReadTally(config, (0, 1, 2))
    # The tally is final once decided: judge it on the answers that led to the decision.
    first: dict[int, Code | None] = {}
    for member, code in answers:
        tally.on_response(member, code, b"x" if code == Code.OK else None)
        first.setdefault(member, code)
        if tally.outcome is not ReadOutcome.PENDING:
            break
    if tally.outcome is ReadOutcome.ENDED:
        negatives = [c for c in first.values() if c in (Code.NO_SUCH_ENTRY, Code.NO_SUCH_STREAM)]
        assert len(negatives) >= 2
        assert Code.OK not in first.values()
    if tally.outcome is ReadOutcome.RECOVERABLE:
        assert Code.OK in first.values()


def test_read_tally_rejects_bad_use() -> None:
    config = QuorumConfig(3, 2, 2)
    with pytest.raises(InvalidArgumentError):
        RecoveryReadTally(config, (0,))
    with pytest.raises(InvalidArgumentError):
        RecoveryReadTally(config, (0, 0))
    with pytest.raises(InvalidArgumentError):
        RecoveryReadTally(config, (0, 1), positives_required=3)
    with pytest.raises(InvalidArgumentError):
        RecoveryReadTally(config, (0, 1), positives_required=0)
    tally: RecoveryReadTally[int, bytes] = RecoveryReadTally(config, (0, 1))
    with pytest.raises(InvariantViolation):
        tally.on_response(2, Code.OK, b"x")
    with pytest.raises(InvariantViolation):
        tally.on_response(0, Code.OK)  # a positive must carry the entry
    with pytest.raises(InvariantViolation):
        _ = tally.entry
    tally.on_response(1, Code.OK, b"x")
    assert tally.outcome is ReadOutcome.RECOVERABLE
    assert not tally.invalid_term_seen
    tally.on_response(0, Code.INVALID_TERM)  # after the decision, still worth knowing
    assert tally.invalid_term_seen


# --- the end scan -----------------------------------------------------------------------------


def test_scan_examples() -> None:
    r, e, u, p = (
        ReadOutcome.RECOVERABLE,
        ReadOutcome.ENDED,
        ReadOutcome.UNKNOWN,
        ReadOutcome.PENDING,
    )
    done = scan_recovery_reads(6, [r, r, e, u, r])
    assert done.status is RecoveryStatus.ENDED
    assert done.last_recovered_entry_id == 8
    assert done.truncate_entry_id == 9
    nothing = scan_recovery_reads(-1, [e])
    assert (nothing.status, nothing.last_recovered_entry_id, nothing.truncate_entry_id) == (
        RecoveryStatus.ENDED,
        -1,
        0,
    )
    aborted = scan_recovery_reads(3, [r, u, e])
    assert (aborted.status, aborted.stopped_at_entry_id) == (RecoveryStatus.ABORTED, 5)
    reading = scan_recovery_reads(3, [r, p, e])
    assert (reading.status, reading.stopped_at_entry_id) == (RecoveryStatus.READING, 5)
    assert scan_recovery_reads(3, []).stopped_at_entry_id == 4
    with pytest.raises(InvariantViolation):
        _ = reading.truncate_entry_id
    with pytest.raises(InvalidArgumentError):
        scan_recovery_reads(-2, [])


@given(st.integers(-1, 1000), st.lists(st.sampled_from(list(ReadOutcome)), max_size=20))
def test_scan_agrees_with_oracle(start: int, outcomes: list[ReadOutcome]) -> None:
    result = scan_recovery_reads(start, outcomes)
    recovered = 0
    while recovered < len(outcomes) and outcomes[recovered] is ReadOutcome.RECOVERABLE:
        recovered += 1
    assert result.last_recovered_entry_id == start + recovered
    assert result.stopped_at_entry_id == start + recovered + 1
    stop = outcomes[recovered] if recovered < len(outcomes) else None
    expected = {
        None: RecoveryStatus.READING,
        ReadOutcome.PENDING: RecoveryStatus.READING,
        ReadOutcome.ENDED: RecoveryStatus.ENDED,
        ReadOutcome.UNKNOWN: RecoveryStatus.ABORTED,
    }[stop]
    assert result.status is expected


# --- scenarios from the references --------------------------------------------------------------


def test_design_takeover_truncates_dirty_tail() -> None:
    """docs/design.md §5 step 2: E=WQ=3, AQ=2; e0 on B1-B3, e1..e20 only on B1 (unreachable)."""
    config = QuorumConfig(3, 3, 2)
    fence = FenceTally(config, last_fragment_first_entry_id=0)
    fence.on_response(1, Code.OK, lac=0, lafr=0)
    fence.on_response(2, Code.OK, lac=0, lafr=0)
    assert fence.outcome is FenceOutcome.COMPLETE
    start = fence.start_entry_id
    assert start == 0
    read: RecoveryReadTally[int, bytes] = RecoveryReadTally(config, config.write_set(start + 1))
    read.on_response(1, Code.NO_SUCH_ENTRY)
    assert read.on_response(2, Code.NO_SUCH_ENTRY) is ReadOutcome.ENDED
    assert scan_recovery_reads(start, [read.outcome]).truncate_entry_id == 1


@pytest.mark.parametrize("limbo", [False, True])
def test_bp46_scenario_2_limbo_prevents_truncating_acknowledged_entry(limbo: bool) -> None:
    """BP-46 scenario 2: e0 acked by B1, B3; B1 lost it in a crash; B2 never had it; B3 is
    silent. Without limbo recovery reads QC explicit negatives and drops e0."""
    config = QuorumConfig(3, 3, 2)
    read: RecoveryReadTally[int, bytes] = RecoveryReadTally(config, config.write_set(0))
    read.on_response(0, limbo_code(Code.NO_SUCH_ENTRY, limbo))  # B1 after the crash
    read.on_response(1, Code.NO_SUCH_ENTRY)  # B2
    read.on_response(2, None)  # B3 times out
    if limbo:
        assert read.outcome is ReadOutcome.UNKNOWN  # abort and retry: never guess
    else:
        assert read.outcome is ReadOutcome.ENDED  # the bug limbo exists to prevent


def test_bp46_aq_variant_needs_ack_quorum_positives() -> None:
    config = QuorumConfig(3, 3, 2)
    read: RecoveryReadTally[int, bytes] = RecoveryReadTally(config, (0, 1, 2), positives_required=2)
    assert read.on_response(0, Code.OK, b"a") is ReadOutcome.PENDING
    assert read.on_response(1, Code.UNKNOWN) is ReadOutcome.PENDING
    assert read.on_response(2, Code.NO_SUCH_ENTRY) is ReadOutcome.UNKNOWN
