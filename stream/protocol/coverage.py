"""Coverage, the rule behind both QC and EC (BP-46): a property holds for a cohort when no
ack quorum (AQ-subset) of the cohort consists only of members that do not satisfy it.

With QC the cohort is one entry's write set; with EC it is a fragment's whole ensemble. Only the
cohort differs, so both use these functions.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TypeVar

from stream.errors import InvalidArgumentError

T = TypeVar("T")


def coverage_threshold(cohort_size: int, ack_quorum: int) -> int:
    """Return how many members must satisfy a property to cover the cohort:
    `cohort_size - ack_quorum + 1` (QC for a write set, EC for an ensemble)."""
    if not 1 <= ack_quorum <= cohort_size:
        raise InvalidArgumentError(
            "coverage needs 1 <= ack_quorum <= cohort_size",
            cohort_size=cohort_size,
            ack_quorum=ack_quorum,
        )
    return cohort_size - ack_quorum + 1


def is_covered(cohort_size: int, ack_quorum: int, satisfied_count: int) -> bool:
    """Return whether `satisfied_count` distinct members of a cohort of `cohort_size` leave no
    AQ-subset made only of members that did not satisfy the property."""
    if not 0 <= satisfied_count <= cohort_size:
        raise InvalidArgumentError(
            "satisfied_count must lie in [0, cohort_size]",
            cohort_size=cohort_size,
            satisfied_count=satisfied_count,
        )
    # The non-satisfying members fit in no AQ-subset iff there are fewer than AQ of them.
    return satisfied_count >= coverage_threshold(cohort_size, ack_quorum)


def cohort_covered(cohort: Iterable[T], ack_quorum: int, satisfied: Collection[T]) -> bool:
    """Return whether the members of `cohort` found in `satisfied` cover it; members of
    `satisfied` outside the cohort do not count."""
    members = set(cohort)
    return is_covered(len(members), ack_quorum, sum(1 for m in members if m in satisfied))
