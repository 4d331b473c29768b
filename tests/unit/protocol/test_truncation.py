"""Which Truncate a bookie applies: within one term truncation points only move forward, so a
late Truncate at or below the point already applied deletes nothing; a newer term's always
applies. Checked exhaustively on a small domain, and against the sequences a writer sends."""

from __future__ import annotations

import itertools

from stream.protocol.truncation import TruncateDecision, truncate_decision

TERMS = range(0, 4)
AFTERS = range(-1, 6)


def test_every_case_exhaustively() -> None:
    for applied_term, applied_after, term, after in itertools.product(
        TERMS, AFTERS, range(1, 4), AFTERS
    ):
        decision = truncate_decision(applied_term, applied_after, term, after)
        if term > applied_term:
            expected = TruncateDecision.APPLY
        elif term < applied_term or after < applied_after:
            expected = TruncateDecision.STALE
        elif after == applied_after:
            expected = TruncateDecision.ALREADY_APPLIED
        else:
            expected = TruncateDecision.APPLY
        assert decision is expected, (applied_term, applied_after, term, after)
        assert decision.serves == (expected is not TruncateDecision.STALE)


def test_the_first_truncate_of_a_stream_always_applies() -> None:
    for after in AFTERS:
        assert truncate_decision(0, -1, 1, after) is TruncateDecision.APPLY


def test_the_late_truncate_the_simulator_found_is_stale() -> None:
    # Truncate(T, 47) timed out, Truncate(T, 53) was applied and 54.. written; then 47 arrives.
    assert truncate_decision(5, 53, 5, 47) is TruncateDecision.STALE
    # The applied one again (a duplicate) must not delete 54.. either.
    assert truncate_decision(5, 53, 5, 53) is TruncateDecision.ALREADY_APPLIED


def test_a_writers_forward_sequence_always_applies_and_replays_the_same() -> None:
    # A term's points only grow; a new term's recovery may truncate lower.
    sequence = [(2, 10), (2, 30), (2, 31), (3, 12), (3, 40)]
    applied = (0, -1)
    for term, after in sequence:
        assert truncate_decision(*applied, term, after) is TruncateDecision.APPLY
        applied = (term, after)
