"""Re-replication decisions (docs/design.md §7), pure: which fragments a lost bookie leaves
under-replicated, which entries a repair must copy, and from whom.

Used by the auditor and the replication workers (`stream.autorecovery`) and by a bookie's own
BP-46 repair (`stream.bookie.integrity`), which copies to itself the same way.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

from stream.protocol.quorum import QuorumConfig

# Longest run of consecutive ids copied by one ReadRange.
COPY_RUN_MAX_ENTRIES = 4_096


@dataclass(frozen=True, slots=True)
class FragmentView:
    """What re-replication needs of one fragment znode: its first id, its ensemble and, once
    closed by a roll, its last id."""

    first_entry_id: int
    ensemble: tuple[str, ...]
    last_entry_id: int | None = None


@dataclass(frozen=True, slots=True)
class AuditFinding:
    """Fragment `index` names `bookies`, which are lost (or being drained): `fixed` says
    whether its end is fixed (a worker can copy it now) or it is the open last fragment of the
    stream (its writer, or a takeover, must close it first)."""

    index: int
    first_entry_id: int
    bookies: tuple[str, ...]
    fixed: bool


def fragment_bounds(
    fragments: Sequence[FragmentView],
    index: int,
    *,
    first_retained: int,
    sealed_last: int | None,
) -> tuple[int, int] | None:
    """Returns `(first, last)`, the ids of fragment `index` a repair must copy (empty when
    `last < first`: nothing retained, or a fragment with no entries), or None when its end is
    not fixed: the last fragment of a stream that is not sealed and was not closed by a roll.

    A fragment followed by another ends right before it: the writer starts a new fragment at
    its LAFR + 1 (every earlier entry reached its whole write set) and a recovery only changes
    the last fragment. A sealed stream ends at `sealed_last` (its final truncate no-op)."""
    fragment = fragments[index]
    first = max(fragment.first_entry_id, first_retained)
    if index + 1 < len(fragments):
        last = fragments[index + 1].first_entry_id - 1
    elif fragment.last_entry_id is not None:
        last = fragment.last_entry_id
    elif sealed_last is not None:
        last = sealed_last
    else:
        return None
    if fragment.last_entry_id is not None:
        last = min(last, fragment.last_entry_id)
    return first, last


def audit_fragments(
    fragments: Sequence[FragmentView],
    bad: Collection[str],
    *,
    first_retained: int,
    sealed_last: int | None,
) -> list[AuditFinding]:
    """Returns one finding per fragment whose ensemble names a bookie of `bad`, in order."""
    findings = []
    for index, fragment in enumerate(fragments):
        named = tuple(b for b in fragment.ensemble if b in bad)
        if not named:
            continue
        bounds = fragment_bounds(
            fragments, index, first_retained=first_retained, sealed_last=sealed_last
        )
        findings.append(AuditFinding(index, fragment.first_entry_id, named, bounds is not None))
    return findings


def replacement_ensemble(ensemble: Sequence[str], replacements: dict[str, str]) -> tuple[str, ...]:
    """Returns `ensemble` with each bookie of `replacements` swapped for its new one, at the
    same index (the write sets, hence what each index stores, stay the same)."""
    return tuple(replacements.get(b, b) for b in ensemble)


def share_runs(
    config: QuorumConfig, index: int, first: int, last: int
) -> Iterator[tuple[int, int]]:
    """Yields the runs `(a, b)` of consecutive ids in `first..last` that ensemble index
    `index` stores (one run when E = WQ)."""
    run_first = run_last = -2  # ids are >= 0
    for entry_id in config.bookie_index_entries(index, first, last):
        if entry_id != run_last + 1:
            if run_last >= 0:
                yield run_first, run_last
            run_first = entry_id
        run_last = entry_id
    if run_last >= 0:
        yield run_first, run_last


def share_ends(config: QuorumConfig, index: int, first: int, last: int) -> list[int]:
    """Returns the first and the last id in `first..last` that index `index` stores (one id,
    or none), looking at no more than E ids at each end."""
    e = config.ensemble
    head = list(config.bookie_index_entries(index, first, min(last, first + e)))[:1]
    tail = list(config.bookie_index_entries(index, max(first, last - e), last))[-1:]
    return sorted(set(head + tail))


def plan_copy_runs(
    config: QuorumConfig,
    ensemble: Sequence[str],
    bookie_id: str,
    missing: Sequence[int],
    rng: random.Random,
    *,
    unavailable: Collection[str] = (),
    max_run_entries: int = COPY_RUN_MAX_ENTRIES,
) -> list[tuple[list[str], int, int]]:
    """Returns the copy plan of `missing` (ascending ids of a fragment on `ensemble` that
    `bookie_id`'s index stores): runs `(peers, first, last)` of consecutive ids, at most
    `max_run_entries` long, whose first peer holds them all (the longest such run from
    `first`; ties broken at random), the other peers of `first`'s write set following as
    fallbacks. Bookies of `unavailable` are never asked; a run may then have no peer."""
    runs: list[tuple[list[str], int, int]] = []
    skip = {bookie_id, *unavailable}
    i = 0
    while i < len(missing):
        first = missing[i]
        peers = [b for b in config.write_set_bookies(ensemble, first) if b not in skip]
        rng.shuffle(peers)
        best, best_end = 0, i + 1
        for k, peer in enumerate(peers):
            j = i + 1
            while (
                j < len(missing)
                and j - i < max_run_entries
                and missing[j] == first + (j - i)
                and peer in config.write_set_bookies(ensemble, missing[j])
            ):
                j += 1
            if j > best_end:
                best, best_end = k, j
        if peers:
            peers.insert(0, peers.pop(best))
        runs.append((peers, first, missing[best_end - 1]))
        i = best_end
    return runs
