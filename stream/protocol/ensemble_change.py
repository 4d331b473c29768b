"""Planning an ensemble change (docs/design.md §5): which fragments result when a failed bookie is
replaced, and which bookies may not be replaced yet (pinning).

The new fragment starts at LAFR + 1 so that every entry not yet at its whole write set moves to
the new ensemble and is resent there; entries up to LAFR keep their write sets.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from stream.errors import InvalidArgumentError
from stream.protocol.fragments import FragmentEnsemble, check_fragments

B = TypeVar("B", bound=Hashable)


def pinned_bookies(ack_sets: Mapping[int, Collection[B]], *, lac: int, lafr: int) -> frozenset[B]:
    """Return the bookies that acked a committed entry that an ensemble change would move
    (`lafr < entry_id <= lac`).

    Such a bookie must not be replaced until that entry reaches WQ: its copy is one of the AQ
    that made the entry committed, and once it left the write set a recovery could read QC
    explicit negatives from the new write set and truncate a committed entry.
    """
    pinned: set[B] = set()
    for entry_id, acked in ack_sets.items():
        if lafr < entry_id <= lac:
            pinned.update(acked)
    return frozenset(pinned)


@dataclass(frozen=True, slots=True)
class EnsembleChange:
    """The outcome of `plan_ensemble_change`: the full new fragment list and what changed."""

    fragments: tuple[FragmentEnsemble, ...]
    first_entry_id: int  # of the new fragment: LAFR + 1
    replaced_index: int  # ensemble index of the failed bookie, now the replacement's
    failed_bookie: str
    replacement: str
    replaces_last: bool  # the new fragment took the place of the previous last fragment

    @property
    def truncate_after_entry_id(self) -> int:
        """Return the id above which the replacement must drop entries before it joins
        (new-member truncation, docs/design.md §5): it may hold dirty entries from an earlier
        term."""
        return self.first_entry_id - 1


def next_to_replace(
    ensemble: Sequence[B], failed: Collection[B], pinned: Collection[B]
) -> B | None:
    """Return the failed bookie of `ensemble` to replace next, or None when none failed.

    An unpinned one goes first, in ensemble order: replacing it now can let LAFR advance, and
    that is what frees a pinned one (the TLA+ `ChangeEnsemble` may take any unpinned subset).
    Only when every failed bookie is pinned is the first of them returned: waiting for its
    committed entries to reach WQ is then the only way on."""
    down = [bookie for bookie in ensemble if bookie in failed]
    return next((bookie for bookie in down if bookie not in pinned), down[0] if down else None)


def plan_ensemble_change(
    fragments: Sequence[tuple[int, Sequence[str]]],
    failed_bookie: str,
    replacement: str,
    *,
    lafr: int,
    pinned: Collection[str] = (),
) -> EnsembleChange | None:
    """Return the fragments after replacing `failed_bookie` in the last fragment's ensemble by
    `replacement` from entry `lafr + 1` on, or None when `failed_bookie` is pinned (wait until
    the committed entries it acked reach WQ, then plan again).

    Raises `InvalidArgumentError` when the fragments are malformed, the failed bookie is not in
    the last ensemble, the replacement already is, or `lafr + 1` lies before the last fragment
    (every entry of an earlier fragment must have reached WQ before that fragment was closed).
    """
    last_first, last_ensemble = fragments[-1] if fragments else (0, ())
    check_fragments(fragments, len(last_ensemble))
    if failed_bookie not in last_ensemble:
        raise InvalidArgumentError(
            "the failed bookie is not in the last fragment's ensemble",
            bookie=failed_bookie,
            ensemble=tuple(last_ensemble),
        )
    if replacement in last_ensemble:
        raise InvalidArgumentError(
            "the replacement is already in the last fragment's ensemble",
            bookie=replacement,
            ensemble=tuple(last_ensemble),
        )
    first_entry_id = lafr + 1
    if first_entry_id < last_first:
        raise InvalidArgumentError(
            "LAFR lies before the last fragment: an earlier fragment was closed before all its "
            "entries reached the write quorum",
            lafr=lafr,
            last_fragment_first_entry_id=last_first,
        )
    if failed_bookie in pinned:
        return None
    replaced_index = list(last_ensemble).index(failed_bookie)
    new_ensemble = tuple(
        replacement if i == replaced_index else bookie for i, bookie in enumerate(last_ensemble)
    )
    kept = [FragmentEnsemble(first, tuple(ensemble)) for first, ensemble in fragments]
    replaces_last = first_entry_id == last_first
    if replaces_last:
        # No entry of the last fragment reached WQ: it is replaced whole, never left empty.
        kept.pop()
    kept.append(FragmentEnsemble(first_entry_id, new_ensemble))
    return EnsembleChange(
        fragments=tuple(kept),
        first_entry_id=first_entry_id,
        replaced_index=replaced_index,
        failed_bookie=failed_bookie,
        replacement=replacement,
        replaces_last=replaces_last,
    )
