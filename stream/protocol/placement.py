"""Choosing bookies for a new ensemble or to replace a failed member (docs/design.md §5, placement).

Randomness comes from the `random.Random` passed in, so a seed reproduces every choice.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from stream.errors import InvalidArgumentError, NotEnoughBookiesError

# A bookie's `max_entry_bytes` when it does not say (bookie.toml's default, and registrations
# older than the field): larger entries are refused with BAD_REQUEST.
DEFAULT_MAX_ENTRY_BYTES = 5 << 20


@dataclass(frozen=True, slots=True)
class BookieCandidate:
    """An available bookie as placement sees it; a lower `load` is preferred. `journal`: it
    runs with `journal_write_data` (an acknowledged entry survives its crash).
    `max_entry_bytes`: the largest payload it accepts."""

    bookie_id: str
    writable: bool = True
    load: int = 0
    journal: bool = True
    max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES


def max_entry_bytes(available: Sequence[BookieCandidate]) -> int:
    """Returns the largest payload every writable bookie accepts: any of them may join a
    stream's ensemble later, so a larger entry could fail there."""
    limits = [c.max_entry_bytes for c in available if c.writable]
    return min(limits, default=DEFAULT_MAX_ENTRY_BYTES)


def journal_required(ack_quorum: int) -> bool:
    """Return whether a stream with this AQ may only be placed on bookies with the journal on
    (docs/design.md §4): with AQ = 1 one crash of a journal-less bookie loses an acknowledged entry
    that no other bookie may hold, and no recovery can tell."""
    return ack_quorum == 1


def choose_ensemble(
    available: Sequence[BookieCandidate],
    size: int,
    rng: random.Random,
    exclude: Collection[str] = (),
    *,
    needs_journal: bool = False,
) -> tuple[str, ...]:
    """Return `size` distinct ids of writable, non-excluded bookies (with the journal on when
    `needs_journal`: see `journal_required`), least loaded first chosen, ties broken with
    `rng`, in an `rng`-shuffled order (so no bookie is always index 0).

    The result depends only on the candidates (not their order) and on `rng`'s state. Raises
    `NotEnoughBookiesError` (needed, available) when fewer than `size` bookies qualify and
    `InvalidArgumentError` for a size below 1 or a duplicate bookie id.
    """
    if type(size) is not int or size < 1:
        raise InvalidArgumentError("ensemble size must be an int >= 1", size=size)
    ids = [c.bookie_id for c in available]
    if len(set(ids)) != len(ids):
        raise InvalidArgumentError("duplicate bookie ids among candidates", bookie_ids=ids)
    excluded = set(exclude)
    # Sorting by id first makes the tie-break draws independent of the registry's order.
    eligible = sorted(
        (c for c in available if c.writable and c.bookie_id not in excluded),
        key=lambda c: c.bookie_id,
    )
    if needs_journal:
        journal_less = sum(1 for c in eligible if not c.journal)
        eligible = [c for c in eligible if c.journal]
        if len(eligible) < size:
            raise NotEnoughBookiesError(
                "not enough writable bookies with the journal on: a stream with ack_quorum = 1 "
                "is never placed on a bookie without journal_write_data (one crash would lose "
                "acknowledged entries)",
                needed=size,
                available=len(eligible),
                journal_less=journal_less,
            )
    if len(eligible) < size:
        raise NotEnoughBookiesError(
            "not enough writable bookies", needed=size, available=len(eligible)
        )
    keyed = [(c.load, rng.random(), c.bookie_id) for c in eligible]
    keyed.sort()
    chosen = [bookie_id for _, _, bookie_id in keyed[:size]]
    rng.shuffle(chosen)
    return tuple(chosen)


def choose_replacement(
    ensemble: Sequence[str],
    failed_index: int,
    available: Sequence[BookieCandidate],
    rng: random.Random,
    exclude: Collection[str] = (),
    *,
    needs_journal: bool = False,
) -> str:
    """Return the id of one writable bookie (with the journal on when `needs_journal`), not in
    `ensemble` (the failed member included) nor in `exclude`, to take the place of
    `ensemble[failed_index]`.

    Raises `NotEnoughBookiesError` when none qualifies and `InvalidArgumentError` for an
    index outside the ensemble.
    """
    if not 0 <= failed_index < len(ensemble):
        raise InvalidArgumentError(
            "failed_index must lie in [0, len(ensemble))",
            failed_index=failed_index,
            ensemble=tuple(ensemble),
        )
    (replacement,) = choose_ensemble(
        available, 1, rng, exclude={*ensemble, *exclude}, needs_journal=needs_journal
    )
    return replacement
