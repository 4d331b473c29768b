"""When a bookie applies a `Truncate` (docs/design.md §4, "New-member truncation"): within one
term truncation points only move forward, so a truncate of that term below (or at) the point
already applied is a late copy and must not delete what the term wrote after it. Pure
decision; the term check comes first (`stream.protocol.terms.term_decision`)."""

from __future__ import annotations

from enum import Enum


class TruncateDecision(Enum):
    """What a bookie does with one Truncate."""

    APPLY = "apply"  # delete above the point and record it
    ALREADY_APPLIED = "already_applied"  # the same point again: answer OK, delete nothing
    STALE = "stale"  # below the point applied in its term: refuse, delete nothing

    @property
    def serves(self) -> bool:
        """Whether the bookie answers OK."""
        return self is not TruncateDecision.STALE


def truncate_decision(
    applied_term: int, applied_after: int, term: int, after_entry_id: int
) -> TruncateDecision:
    """Return what a bookie that last applied `Truncate(applied_term, applied_after)` to a
    stream (term 0: none) does with `Truncate(term, after_entry_id)`.

    A writer's fragments start at LAFR + 1, which only grows within a term, and recovery's
    truncations stay at or below the no-op that the term's first fragment follows: a term's
    truncation points never go backwards. So after `Truncate(T, a)` every entry above `a`
    the bookie holds was added in term T after it, and a later `Truncate(T, b <= a)` is a
    delayed or repeated request whose sender has moved on: deleting above `b` would delete
    acknowledged entries of its own term. A newer term's truncate always applies (its
    recovery decides afresh); an older term's is stale (the term rule refuses it first)."""
    if term > applied_term:
        return TruncateDecision.APPLY
    if term < applied_term or after_entry_id < applied_after:
        return TruncateDecision.STALE
    if after_entry_id == applied_after:
        return TruncateDecision.ALREADY_APPLIED
    return TruncateDecision.APPLY


def stale_truncate_message(term: int, after_entry_id: int, applied_after: int) -> str:
    """The refusal's text for a stale `Truncate(term, after_entry_id)`."""
    return (
        f"Truncate(term {term}, after {after_entry_id}) is stale: the bookie already applied "
        f"Truncate(term {term}, after {applied_after}) and holds what the term wrote since"
    )
