"""Limbo in the recovery reads (docs/design.md §4): when only bookies in limbo keep an entry
undecided (`limbo_blocked`), and what an accept-loss recovery decides there, exhaustively for small
configurations against the plain tally."""

from __future__ import annotations

from itertools import product

import pytest

from stream.protocol.codes import Code, limbo_code
from stream.protocol.quorum import QuorumConfig
from stream.protocol.recovery import ReadOutcome, RecoveryReadTally, limbo_blocked

POS, NEG, LIMBO, SILENT = "pos", "neg", "limbo", "silent"
# What each kind of answer looks like on the wire: a limbo bookie's negative is UNKNOWN.
CODE = {
    POS: Code.OK,
    NEG: Code.NO_SUCH_ENTRY,
    LIMBO: limbo_code(Code.NO_SUCH_ENTRY, True),
    SILENT: None,  # a timeout: that bookie may hold the entry
}


def _tally(
    config: QuorumConfig, answers: tuple[str, ...], *, accept_loss: bool
) -> RecoveryReadTally[int, str]:
    write_set = config.write_set(0)
    tally: RecoveryReadTally[int, str] = RecoveryReadTally(
        config, write_set, accept_loss=accept_loss
    )
    for member, kind in zip(write_set, answers, strict=True):
        tally.on_response(member, CODE[kind], "entry" if kind == POS else None)
    return tally


@pytest.mark.parametrize("wq", range(1, 6))
def test_accept_loss_differs_only_where_limbo_alone_blocks(wq: int) -> None:
    for aq in range(1, wq + 1):
        config = QuorumConfig(wq, wq, aq)
        for answers in product((POS, NEG, LIMBO, SILENT), repeat=wq):
            plain = _tally(config, answers, accept_loss=False)
            lossy = _tally(config, answers, accept_loss=True)
            # Oracle: nobody holds the entry, every member answered, and every answer short
            # of an explicit negative came from a bookie in limbo (at least one did).
            blocked = (
                POS not in answers
                and SILENT not in answers
                and LIMBO in answers
                and answers.count(NEG) < config.quorum_coverage
            )
            assert plain.blocked_by_limbo is blocked, (config, answers)
            if blocked:
                assert plain.outcome is ReadOutcome.UNKNOWN  # retried, never guessed
                assert lossy.outcome is ReadOutcome.ENDED
                assert lossy.blocked_by_limbo
                pairs = zip(config.write_set(0), answers, strict=True)
                limbo = tuple(m for m, a in pairs if a == LIMBO)
                assert plain.limbo_members == limbo
            else:
                assert lossy.outcome is plain.outcome, (config, answers)


def test_limbo_blocked_needs_every_member_and_no_silence() -> None:
    config = QuorumConfig(3, 3, 2)  # QC = 2
    assert limbo_blocked(config, 0, 1, 2, 2)  # B3 says absent, B1 and B2 in limbo
    assert limbo_blocked(config, 0, 0, 3, 3)  # all three in limbo
    assert not limbo_blocked(config, 0, 1, 2, 1)  # one of them timed out: it may hold it
    assert not limbo_blocked(config, 0, 1, 1, 1)  # one has not answered yet
    assert not limbo_blocked(config, 1, 0, 2, 2)  # someone holds it: recoverable
    assert not limbo_blocked(config, 0, 2, 1, 1)  # QC negatives: ended without any loss
    assert not limbo_blocked(config, 0, 3, 0, 0)


def test_issue_scenario_two_of_three_in_limbo() -> None:
    """e3w3a2, B1 and B2 crashed together and came back in limbo, B3 says the entry after the
    end is absent: plain recovery can never decide; an accept-loss recovery ends there."""
    config = QuorumConfig(3, 3, 2)
    plain = _tally(config, (LIMBO, LIMBO, NEG), accept_loss=False)
    assert plain.outcome is ReadOutcome.UNKNOWN
    assert plain.blocked_by_limbo and plain.limbo_members == (0, 1)
    assert _tally(config, (LIMBO, LIMBO, NEG), accept_loss=True).outcome is ReadOutcome.ENDED
    # B3 unreachable: it may hold the entry, so even an accept-loss recovery waits for it.
    silent = _tally(config, (LIMBO, LIMBO, SILENT), accept_loss=True)
    assert silent.outcome is ReadOutcome.UNKNOWN and not silent.blocked_by_limbo
    # Any copy left anywhere is recovered, limbo or not.
    assert _tally(config, (LIMBO, POS, NEG), accept_loss=True).outcome is ReadOutcome.RECOVERABLE


def test_a_later_answer_does_not_unblock_a_decided_tally() -> None:
    config = QuorumConfig(3, 3, 2)
    tally: RecoveryReadTally[int, str] = RecoveryReadTally(config, (0, 1, 2), accept_loss=True)
    tally.on_response(0, Code.UNKNOWN)
    tally.on_response(1, Code.UNKNOWN)
    assert tally.outcome is ReadOutcome.PENDING  # B3 may still hold it
    assert tally.on_response(2, Code.NO_SUCH_ENTRY) is ReadOutcome.ENDED
    assert tally.on_response(2, Code.OK, "late") is ReadOutcome.ENDED
