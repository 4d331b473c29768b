"""The bookie's term rule, exhaustively for small terms and by property for large ones."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream.protocol.codes import Code
from stream.protocol.invariant import InvariantViolation
from stream.protocol.terms import (
    TermDecision,
    must_justify_term,
    must_learn_term,
    term_decision,
    term_justified,
)


def oracle(local: int, request: int) -> TermDecision:
    if request <= 0:
        return TermDecision.BAD
    if local > request:
        return TermDecision.REJECT
    return TermDecision.ACCEPT if local == request else TermDecision.ACCEPT_NEW


def test_exhaustive_small_terms() -> None:
    for local in range(0, 8):
        for request in range(-3, 10):
            assert term_decision(local, request) is oracle(local, request), (local, request)


@given(st.integers(0, 2**64 - 1), st.integers(-(2**63), 2**64 - 1))
def test_large_terms(local: int, request: int) -> None:
    decision = term_decision(local, request)
    assert decision is oracle(local, request)
    assert decision.serves == (decision.code is Code.OK)
    # A served request leaves the bookie at the request's term: never lower than before.
    if decision.serves:
        assert request >= local


def test_never_seen_stream_accepts_any_valid_term_as_new() -> None:
    assert term_decision(0, 1) is TermDecision.ACCEPT_NEW
    assert term_decision(0, 0) is TermDecision.BAD


def test_decision_properties() -> None:
    table = {
        TermDecision.ACCEPT: (True, False, Code.OK),
        TermDecision.ACCEPT_NEW: (True, True, Code.OK),
        TermDecision.REJECT: (False, False, Code.INVALID_TERM),
        TermDecision.BAD: (False, False, Code.BAD_REQUEST),
    }
    for decision, (serves, records, code) in table.items():
        assert (decision.serves, decision.records_new_term, decision.code) == (
            serves,
            records,
            code,
        )


def test_negative_local_term_is_a_bug() -> None:
    with pytest.raises(InvariantViolation):
        term_decision(-1, 3)


def test_must_learn_term_exhaustive_small_inputs() -> None:
    # Only a stream the bookie holds no state for, created before its disk's loss was repaired
    # (an id below the counter then), may have had a term the bookie forgot.
    for stream_id in range(0, 8):
        for known in (False, True):
            for forgotten_below in range(0, 9):
                expected = (not known) and stream_id >= 1 and stream_id < forgotten_below
                assert (
                    must_learn_term(stream_id, known=known, forgotten_below=forgotten_below)
                    is expected
                ), (stream_id, known, forgotten_below)


def test_a_bookie_that_never_lost_its_disk_never_reads_metadata() -> None:
    assert not must_learn_term(1, known=False, forgotten_below=0)
    with pytest.raises(InvariantViolation):
        must_learn_term(1, known=False, forgotten_below=-1)


def test_a_term_is_checked_against_metadata_only_when_it_would_raise_the_bookies() -> None:
    # Exhaustively for small terms: a read only for a term above both the bookie's term and
    # the highest term metadata was already seen to hold (one read per takeover).
    for request in range(0, 6):
        for local in range(0, 6):
            for justified in range(0, 6):
                expected = request > max(local, justified)
                assert (
                    must_justify_term(request, local_term=local, justified_term=justified)
                    is expected
                ), (request, local, justified)


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_only_a_term_metadata_handed_out_is_justified(request: int, metadata: int) -> None:
    assert term_justified(request, metadata) is (request <= metadata)


def test_the_poisoned_term_of_the_issue_is_not_justified() -> None:
    assert must_justify_term(2**64 - 1, local_term=3, justified_term=3)
    assert not term_justified(2**64 - 1, 4)
