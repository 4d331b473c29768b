"""A stream's fragments as the protocol sees them: sorted `(first_entry_id, ensemble)` pairs."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import NamedTuple

from stream.errors import InvalidArgumentError


class FragmentEnsemble(NamedTuple):
    """One fragment: entries from `first_entry_id` up to the next fragment's first id (the last
    fragment is open-ended) are striped over `ensemble`."""

    first_entry_id: int
    ensemble: tuple[str, ...]


def check_fragments(fragments: Sequence[tuple[int, Sequence[str]]], ensemble_size: int) -> None:
    """Return None when `fragments` is non-empty, sorted by strictly increasing first ids >= 0,
    and every ensemble holds `ensemble_size` distinct bookies; else raise
    `InvalidArgumentError` naming the first bad fragment."""
    if not fragments:
        raise InvalidArgumentError("a stream has at least one fragment")
    previous = -1
    for first_entry_id, ensemble in fragments:
        if first_entry_id < 0 or first_entry_id <= previous:
            raise InvalidArgumentError(
                "fragment first ids must be >= 0 and strictly increasing",
                first_entry_id=first_entry_id,
                previous_first_entry_id=previous,
            )
        if len(ensemble) != ensemble_size or len(set(ensemble)) != len(ensemble):
            raise InvalidArgumentError(
                "a fragment's ensemble must hold distinct bookies, ensemble_size of them",
                first_entry_id=first_entry_id,
                ensemble=tuple(ensemble),
                ensemble_size=ensemble_size,
            )
        previous = first_entry_id


def fragment_index_for(fragments: Sequence[tuple[int, Sequence[str]]], entry_id: int) -> int:
    """Return the index in `fragments` (sorted) of the fragment holding `entry_id`; raise
    `InvalidArgumentError` when `entry_id` lies before the first fragment."""
    index = bisect_right(fragments, entry_id, key=lambda f: f[0]) - 1
    if index < 0:
        raise InvalidArgumentError(
            "entry_id lies before the first fragment",
            entry_id=entry_id,
            first_entry_id=fragments[0][0] if fragments else None,
        )
    return index


def ensemble_for(fragments: Sequence[tuple[int, Sequence[str]]], entry_id: int) -> tuple[str, ...]:
    """Return the ensemble of the fragment holding `entry_id`."""
    return tuple(fragments[fragment_index_for(fragments, entry_id)][1])
