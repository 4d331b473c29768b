"""The writer's pending-add tracker: which entries are acknowledged (LAC), which reached their
whole write set (LAFR), and what an ensemble change must resend. Pure state, no I/O.

Bookies are identified by whatever hashable the caller uses for them, normally bookie ids:
never ensemble indices, because after an ensemble change a late ack from the replaced bookie
would be counted for its replacement at the same index.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Generic, TypeVar

from stream.errors import InvalidArgumentError
from stream.protocol.ensemble_change import pinned_bookies
from stream.protocol.invariant import invariant
from stream.protocol.quorum import QuorumConfig

B = TypeVar("B", bound=Hashable)

# Bound on the cache of checked write sets (ensemble changes and rolls bring new ones).
_MAX_CHECKED_WRITE_SETS = 1024


@dataclass(slots=True)
class _PendingEntry(Generic[B]):
    write_set: tuple[B, ...]
    # A tuple, not a set: at most WQ bookies, and a tuple of ids is dropped from the cyclic
    # GC's tracking while a set stays tracked (thousands of entries are in flight at a time).
    acked: tuple[B, ...]


class PendingAdds(Generic[B]):
    """Entries added but not yet at their whole write set, and the LAC/LAFR they give.

    - An entry is acknowledged to the application once it and every lower entry reached AQ
      acks from their write sets; `on_ack` returns the newly acknowledged ids in order.
    - An entry is forgotten once it and every lower entry reached WQ (LAFR moved past it).
    - An ack from a bookie outside the entry's current write set is ignored: it is a late ack
      from a bookie an ensemble change replaced, whose copy metadata no longer lists. A
      duplicate ack, or an ack for an entry at or below LAFR, is ignored too. An ack for an
      entry never added is a bug (`InvariantViolation`).
    - At most `max_in_flight` entries are held (added, not yet at WQ); check `has_room()`.

    The tracker starts after `last_entry_id` with LAC = LAFR = `last_entry_id` (-1: none): a
    writer starts only after recovery, which leaves every entry up to its truncate no-op at
    its whole write set, so there is no acknowledged-but-not-fully-replicated entry to inherit.
    """

    def __init__(self, config: QuorumConfig, *, max_in_flight: int, last_entry_id: int = -1):
        if type(max_in_flight) is not int or max_in_flight < 1:
            raise InvalidArgumentError("max_in_flight must be an int >= 1", limit=max_in_flight)
        if last_entry_id < -1:
            raise InvalidArgumentError("last_entry_id must be >= -1", entry_id=last_entry_id)
        self._config = config
        self._max_in_flight = max_in_flight
        self._lac = last_entry_id
        self._lafr = last_entry_id
        self._next_entry_id = last_entry_id + 1
        # Holds exactly the ids lafr+1 .. next_entry_id-1.
        self._pending: dict[int, _PendingEntry[B]] = {}
        # Write sets already found to hold WQ distinct bookies (a writer reuses E of them).
        self._checked_write_sets: set[tuple[B, ...]] = set()

    @property
    def lac(self) -> int:
        """Return the last add confirmed: the highest id that, with every lower id, reached AQ."""
        return self._lac

    @property
    def lafr(self) -> int:
        """Return the last add fully replicated: the highest id that, with every lower id,
        reached its whole write set."""
        return self._lafr

    @property
    def next_entry_id(self) -> int:
        """Return the id the next `add` must use."""
        return self._next_entry_id

    @property
    def in_flight(self) -> int:
        """Return how many entries are held: added and not yet below LAFR."""
        return self._next_entry_id - 1 - self._lafr

    def has_room(self) -> bool:
        """Return whether one more entry may be added within `max_in_flight`."""
        return self.in_flight < self._max_in_flight

    def room(self) -> int:
        """Return how many more entries may be added within `max_in_flight`."""
        return self._max_in_flight - self.in_flight

    def add(self, entry_id: int, write_set: Sequence[B]) -> None:
        """Start tracking `entry_id`, which will be sent to the WQ distinct bookies of
        `write_set`. The id must be `next_entry_id` and `has_room()` must hold."""
        # On every append's path: the invariants are evaluated (with their context dicts)
        # only when the cheap test already failed.
        if entry_id != self._next_entry_id:
            invariant(
                False,
                "entries are added in id order without gaps",
                entry_id=entry_id,
                expected=self._next_entry_id,
            )
        if self._next_entry_id - 1 - self._lafr >= self._max_in_flight:
            invariant(False, "add beyond max_in_flight", limit=self._max_in_flight)
        members = tuple(write_set)
        if members not in self._checked_write_sets:
            invariant(
                len(members) == self._config.write_quorum and len(set(members)) == len(members),
                "a write set holds WQ distinct bookies",
                entry_id=entry_id,
                write_set=members,
            )
            if len(self._checked_write_sets) < _MAX_CHECKED_WRITE_SETS:
                self._checked_write_sets.add(members)
        self._pending[entry_id] = _PendingEntry(members, ())
        self._next_entry_id = entry_id + 1

    def add_run(self, first_entry_id: int, write_sets: Sequence[Sequence[B]]) -> None:
        """Start tracking `first_entry_id`, `first_entry_id + 1`, ... with `write_sets` in
        order: the same as `add` for each in turn (a property test checks this), each distinct
        write set checked once. The first id must be `next_entry_id` and `room()` must be at
        least `len(write_sets)`."""
        count = len(write_sets)
        if first_entry_id != self._next_entry_id:
            invariant(
                False,
                "entries are added in id order without gaps",
                entry_id=first_entry_id,
                expected=self._next_entry_id,
            )
        if self._next_entry_id - 1 - self._lafr + count > self._max_in_flight:
            invariant(False, "add beyond max_in_flight", limit=self._max_in_flight, count=count)
        members = list(map(tuple, write_sets))
        for write_set in set(members) - self._checked_write_sets:
            invariant(
                len(write_set) == self._config.write_quorum
                and len(set(write_set)) == len(write_set),
                "a write set holds WQ distinct bookies",
                entry_id=first_entry_id,
                write_set=write_set,
            )
            if len(self._checked_write_sets) < _MAX_CHECKED_WRITE_SETS:
                self._checked_write_sets.add(write_set)
        end = first_entry_id + count
        self._pending.update(
            zip(range(first_entry_id, end), map(_PendingEntry, members, repeat(())), strict=True)
        )
        self._next_entry_id = end

    def on_ack(self, entry_id: int, bookie: B) -> list[int]:
        """Record that `bookie` durably stored `entry_id`; return the ids newly acknowledged
        to the application by this ack, in increasing order (often empty)."""
        entry = self._pending.get(entry_id)
        if entry is None:
            invariant(
                entry_id <= self._lafr,
                "ack for an entry never added",
                entry_id=entry_id,
                bookie=bookie,
            )
            return []
        if bookie not in entry.write_set or bookie in entry.acked:
            return []
        entry.acked += (bookie,)
        acknowledged: list[int] = []
        if entry_id == self._lac + 1:
            aq = self._config.ack_quorum
            candidate = self._pending.get(self._lac + 1)
            while candidate is not None and len(candidate.acked) >= aq:
                self._lac += 1
                acknowledged.append(self._lac)
                candidate = self._pending.get(self._lac + 1)
        if entry_id == self._lafr + 1:
            self._advance_lafr()
        return acknowledged

    def on_acks(self, bookie: B, entry_ids: Iterable[int]) -> list[int]:
        """Record that `bookie` durably stored each of `entry_ids` (one add answer); return
        the ids newly acknowledged to the application, in increasing order.

        The same as calling `on_ack(entry_id, bookie)` for each id in turn and concatenating
        the results (a property test checks this), with LAC and LAFR moved once at the end:
        both are functions of the ack sets alone (the longest prefix at AQ, at the whole
        write set), so moving them once per answer instead of once per entry changes nothing
        but the cost."""
        pending = self._pending
        lafr = self._lafr
        for entry_id in entry_ids:
            entry = pending.get(entry_id)
            if entry is None:
                if entry_id > lafr:
                    invariant(
                        False, "ack for an entry never added", entry_id=entry_id, bookie=bookie
                    )
                continue
            acked = entry.acked
            if bookie not in acked and bookie in entry.write_set:
                entry.acked = (*acked, bookie)
        acknowledged: list[int] = []
        aq = self._config.ack_quorum
        lac = self._lac
        candidate = pending.get(lac + 1)
        while candidate is not None and len(candidate.acked) >= aq:
            lac += 1
            candidate = pending.get(lac + 1)
        if lac != self._lac:
            acknowledged = list(range(self._lac + 1, lac + 1))
            self._lac = lac
        candidate = pending.get(lafr + 1)
        if candidate is not None and len(candidate.acked) == len(candidate.write_set):
            self._advance_lafr()
        return acknowledged

    def replace_bookie(self, failed: B, replacement: B) -> list[int]:
        """Apply an ensemble change to the held entries: `replacement` takes `failed`'s place
        in their write sets and `failed` leaves their ack sets. Return the ids that must now
        be sent to `replacement`, in increasing order.

        `failed` must not be pinned (see `pinned_bookies`); `replacement` must be in no held
        write set.
        """
        invariant(failed != replacement, "a bookie cannot replace itself", bookie=failed)
        invariant(
            failed not in self.pinned_bookies(),
            "a pinned bookie is never replaced",
            bookie=failed,
            lac=self._lac,
            lafr=self._lafr,
        )
        resend: list[int] = []
        for entry_id in range(self._lafr + 1, self._next_entry_id):
            entry = self._pending[entry_id]
            invariant(
                replacement not in entry.write_set,
                "the replacement is already in a write set",
                entry_id=entry_id,
                bookie=replacement,
            )
            if failed in entry.write_set:
                entry.write_set = tuple(replacement if b == failed else b for b in entry.write_set)
                entry.acked = tuple(b for b in entry.acked if b != failed)
                resend.append(entry_id)
        return resend

    def pinned_bookies(self) -> frozenset[B]:
        """Return the bookies that acked a committed entry not yet at WQ; an ensemble change
        must not replace them (see `ensemble_change.pinned_bookies`)."""
        return pinned_bookies(
            {eid: e.acked for eid, e in self._pending.items()}, lac=self._lac, lafr=self._lafr
        )

    def entries_not_fully_replicated(self) -> range:
        """Return the held ids: added, not yet (with every lower id) at the whole write set."""
        return range(self._lafr + 1, self._next_entry_id)

    def unacknowledged(self) -> range:
        """Return the ids added but not yet acknowledged to the application (above LAC)."""
        return range(self._lac + 1, self._next_entry_id)

    def write_set(self, entry_id: int) -> tuple[B, ...]:
        """Return the current write set of held entry `entry_id`."""
        return self._held(entry_id).write_set

    def ack_set(self, entry_id: int) -> frozenset[B]:
        """Return the bookies of the current write set that acked held entry `entry_id`."""
        return frozenset(self._held(entry_id).acked)

    def _held(self, entry_id: int) -> _PendingEntry[B]:
        entry = self._pending.get(entry_id)
        if entry is None:
            raise InvalidArgumentError(
                "entry is not held", entry_id=entry_id, lafr=self._lafr, next=self._next_entry_id
            )
        return entry

    def _advance_lafr(self) -> None:
        candidate = self._pending.get(self._lafr + 1)
        while candidate is not None and len(candidate.acked) == len(candidate.write_set):
            del self._pending[self._lafr + 1]
            self._lafr += 1
            candidate = self._pending.get(self._lafr + 1)
        invariant(self._lafr <= self._lac, "LAFR never passes LAC", lac=self._lac, lafr=self._lafr)
