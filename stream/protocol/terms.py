"""The bookie's term rule for every term-bearing request (docs/design.md §4), as a pure decision,
and when a bookie must first learn a stream's term from metadata because a wiped disk may have
taken it."""

from __future__ import annotations

from enum import Enum

from stream.protocol.codes import Code
from stream.protocol.invariant import invariant


class TermDecision(Enum):
    """What a bookie does with a term-bearing request, given its own term for the stream."""

    ACCEPT = "accept"  # same term: serve it
    ACCEPT_NEW = "accept_new"  # higher term: record it durably (fsync) first, then serve
    REJECT = "reject"  # lower term: answer INVALID_TERM with the bookie's term
    BAD = "bad"  # a term below 1 on a request that needs one: BAD_REQUEST

    @property
    def serves(self) -> bool:
        """Return whether the request is served."""
        return self is TermDecision.ACCEPT or self is TermDecision.ACCEPT_NEW

    @property
    def records_new_term(self) -> bool:
        """Return whether the request's term must be recorded durably before answering."""
        return self is TermDecision.ACCEPT_NEW

    @property
    def code(self) -> Code:
        """Return the response code: OK when served, else INVALID_TERM or BAD_REQUEST."""
        return _CODE_BY_DECISION[self]


_CODE_BY_DECISION = {
    TermDecision.ACCEPT: Code.OK,
    TermDecision.ACCEPT_NEW: Code.OK,
    TermDecision.REJECT: Code.INVALID_TERM,
    TermDecision.BAD: Code.BAD_REQUEST,
}


def term_decision(local_term: int, request_term: int) -> TermDecision:
    """Return how a bookie whose term for the stream is `local_term` (0: it never saw the
    stream) treats a request carrying `request_term`."""
    invariant(local_term >= 0, "a bookie's term is never negative", local_term=local_term)
    if request_term < 1:
        return TermDecision.BAD
    if request_term == local_term:
        return TermDecision.ACCEPT
    if request_term > local_term:
        return TermDecision.ACCEPT_NEW
    return TermDecision.REJECT


def must_learn_term(stream_id: int, *, known: bool, forgotten_below: int) -> bool:
    """Return whether a bookie must read a stream's term from metadata (and record it durably)
    before it applies `term_decision` to a term-bearing request for it.

    A wiped or replaced disk forgets every term, also those of SEALED streams and of streams
    whose fragments no longer name the bookie, which BP-46 phase one does not fence (docs/design.md
    §4: a bookie never answers with a term it may have forgotten). `forgotten_below` is the
    stream id counter read when the disk's loss was repaired (the cookie fix; 0: never): only
    streams created before then (lower ids; ids are never reused) can have had a term here.
    A stream the bookie holds state for (`known`) kept its term or learned it since."""
    invariant(forgotten_below >= 0, "a stream id bound is never negative")
    return not known and 0 < stream_id < forgotten_below


def must_justify_term(request_term: int, *, local_term: int, justified_term: int) -> bool:
    """Return whether a bookie must read metadata's term for a stream before it serves a
    request carrying `request_term`: the request would raise the bookie's term (`local_term`)
    beyond the highest term metadata was already seen to hold (`justified_term`, 0: none).
    Metadata's term only grows, so one read per takeover suffices (docs/design.md §4)."""
    return request_term > local_term and request_term > justified_term


def term_justified(request_term: int, metadata_term: int) -> bool:
    """Return whether metadata's term for a stream justifies a bookie taking `request_term`:
    a writer raises metadata's term (CAS) before any bookie sees it, so a higher term was
    never handed out and is refused (a poisoned term would fence the stream for good)."""
    return request_term <= metadata_term
