"""The writer's pending-add tracker: which entries are acknowledged (LAC), which reached their
whole write set (LAFR), and what an ensemble change must resend. Pure state, no I/O.

Bookies are identified by whatever hashable the caller uses for them, normally bookie ids:
never ensemble indices, because after an ensemble change a late ack from the replaced bookie
would be counted for its replacement at the same index.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Generic, TypeVar

from stream.errors import InvalidArgumentError
from stream.protocol.ensemble_change import pinned_bookies
from stream.protocol.invariant import invariant
from stream.protocol.quorum import QuorumConfig

B = TypeVar("B", bound=Hashable)

# Bound on the cache of checked write sets (ensemble changes and rolls bring new ones).
_MAX_CHECKED_WRITE_SETS = 1024


@dataclass(slots=True)
class _Run(Generic[B]):
    """Held entries `first` .. `end - 1`, all with write sets of these members and these
    acks (each entry's write set, in its order, is kept beside the runs).

    Entries are held in runs, not one by one: a writer's consecutive entries share the
    members of their write set (every one of them when E = WQ, in rotated orders) and a
    bookie acks a batch of them at once, so an answer updates a few runs (split where the
    batch starts and ends) instead of every entry, and LAC and LAFR move a run at a time."""

    first: int
    end: int
    members: frozenset[B]
    # A tuple, not a set: at most WQ bookies, and shared by the runs a split makes.
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
        # `_runs[_head:]` hold exactly the ids lafr+1 .. next_entry_id-1, in order, and
        # `_starts` their first ids (for bisect); the runs below `_head` are forgotten ones
        # (LAFR passed them), dropped from the lists now and then rather than one by one.
        self._runs: list[_Run[B]] = []
        self._starts: list[int] = []
        self._head = 0
        # Each held entry's write set, in order: `_write_sets[i]` is entry `_base + i`'s (the
        # ones below LAFR + 1 are dropped now and then, as the runs are).
        self._write_sets: list[tuple[B, ...]] = []
        self._base = last_entry_id + 1
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
        self._append_run(entry_id, 1, frozenset(members))
        self._write_sets.append(members)
        self._next_entry_id = entry_id + 1

    def _append_run(self, first: int, count: int, members: frozenset[B]) -> None:
        """Holds `count` new entries from `first` (the next id) with write sets of `members`:
        the last run grows when it has the same members and no ack yet."""
        runs = self._runs
        if len(runs) > self._head:
            last = runs[-1]
            if not last.acked and last.members == members:
                last.end += count
                return
        runs.append(_Run(first, first + count, members, ()))
        self._starts.append(first)

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
        distinct = set(members)
        for write_set in distinct - self._checked_write_sets:
            invariant(
                len(write_set) == self._config.write_quorum
                and len(set(write_set)) == len(write_set),
                "a write set holds WQ distinct bookies",
                entry_id=first_entry_id,
                write_set=write_set,
            )
            if len(self._checked_write_sets) < _MAX_CHECKED_WRITE_SETS:
                self._checked_write_sets.add(write_set)
        # Runs of the same members: one when every write set has the same members (E = WQ,
        # in rotated orders), else C-level loops (a dict lookup per entry) and a run each.
        member_sets = {write_set: frozenset(write_set) for write_set in distinct}
        if len(set(member_sets.values())) == 1:
            self._append_run(first_entry_id, count, member_sets[members[0]])
        else:
            first = first_entry_id
            for same_members, same in groupby(members, member_sets.__getitem__):
                length = len(list(same))
                self._append_run(first, length, same_members)
                first += length
        self._write_sets += members
        self._next_entry_id = first_entry_id + count

    def on_ack(self, entry_id: int, bookie: B) -> list[int]:
        """Record that `bookie` durably stored `entry_id`; return the ids newly acknowledged
        to the application by this ack, in increasing order (often empty)."""
        return list(self.acknowledge(bookie, (entry_id,)))

    def on_acks(self, bookie: B, entry_ids: Iterable[int]) -> list[int]:
        """Record that `bookie` durably stored each of `entry_ids` (one add answer); return
        the ids newly acknowledged to the application, in increasing order.

        The same as calling `on_ack(entry_id, bookie)` for each id in turn and concatenating
        the results (a property test checks this), with LAC and LAFR moved once at the end:
        both are functions of the ack sets alone (the longest prefix at AQ, at the whole
        write set), so moving them once per answer instead of once per entry changes nothing
        but the cost."""
        return list(self.acknowledge(bookie, entry_ids))

    def acknowledge(self, bookie: B, entry_ids: Iterable[int]) -> range:
        """`on_acks`, returning the newly acknowledged ids as a range: what the writer's
        answers go through, at a cost per answer (an answer's ids are consecutive: one span,
        whatever its length) rather than per entry.

        Recording an ack is adding `bookie` to a set: the order of `entry_ids` and repeats do
        not matter, so they are recorded as spans of consecutive ids in increasing order (an
        id never added is a bug, `InvariantViolation`, as soon as it is met)."""
        if type(entry_ids) is range and entry_ids.step == 1:  # a ranged answer: one span
            if entry_ids:
                self._ack_span(bookie, entry_ids.start, entry_ids.stop)
        else:
            ids = entry_ids if type(entry_ids) is list else list(entry_ids)
            count = len(ids)
            if count:
                first = ids[0]
                if ids[-1] - first == count - 1 and (
                    count < 3 or ids == list(range(first, first + count))
                ):
                    self._ack_span(bookie, first, first + count)
                else:
                    for low, high in _spans(sorted(set(ids))):
                        self._ack_span(bookie, low, high)
        lac = self._lac
        runs = self._runs
        if lac + 1 < self._next_entry_id:
            aq = self._config.ack_quorum
            index = bisect_right(self._starts, lac + 1, self._head) - 1
            while index < len(runs) and len(runs[index].acked) >= aq:
                lac = runs[index].end - 1
                index += 1
        acknowledged = range(self._lac + 1, lac + 1)
        self._lac = lac
        head = self._head
        if head < len(runs) and len(runs[head].acked) == len(runs[head].members):
            self._advance_lafr()
        return acknowledged

    def _ack_span(self, bookie: B, low: int, high: int) -> None:
        """Records `bookie`'s ack of ids `low` .. `high - 1`, splitting the runs it covers in
        part; the ids at or below LAFR are forgotten ones (ignored), ids from `next_entry_id`
        were never added (a bug)."""
        if high > self._next_entry_id:
            # What `on_ack` met first: the lowest id past the held ones.
            invariant(
                False,
                "ack for an entry never added",
                entry_id=max(low, self._next_entry_id),
                bookie=bookie,
            )
        low = max(low, self._lafr + 1)
        runs = self._runs
        index = bisect_right(self._starts, low, self._head) - 1
        while low < high:
            run = runs[index]
            if bookie in run.acked or bookie not in run.members:
                low = run.end
                index += 1
                continue
            if run.first < low:
                self._split(index, low)
                index += 1
                run = runs[index]
            if run.end > high:
                self._split(index, high)
            run.acked = (*run.acked, bookie)
            low = run.end
            index += 1

    def _split(self, index: int, at: int) -> None:
        """Splits run `index` in two at id `at` (inside it)."""
        run = self._runs[index]
        self._runs.insert(index + 1, _Run(at, run.end, run.members, run.acked))
        self._starts.insert(index + 1, at)
        run.end = at

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
        for run in self._runs[self._head :]:
            invariant(
                replacement not in run.members,
                "the replacement is already in a write set",
                entry_id=run.first,
                bookie=replacement,
            )
            if failed in run.members:
                run.members = run.members - {failed} | {replacement}
                run.acked = tuple(b for b in run.acked if b != failed)
                resend.extend(range(run.first, run.end))
                write_sets = self._write_sets
                for index in range(run.first - self._base, run.end - self._base):
                    write_sets[index] = tuple(
                        replacement if b == failed else b for b in write_sets[index]
                    )
        return resend

    def pinned_bookies(self) -> frozenset[B]:
        """Return the bookies that acked a committed entry not yet at WQ; an ensemble change
        must not replace them (see `ensemble_change.pinned_bookies`)."""
        # A run stands for its entries by its first id: it holds an entry in (LAFR, LAC]
        # exactly when its first id is in it (held runs start above LAFR), with the same acks.
        return pinned_bookies(
            {run.first: run.acked for run in self._runs[self._head :]},
            lac=self._lac,
            lafr=self._lafr,
        )

    def entries_not_fully_replicated(self) -> range:
        """Return the held ids: added, not yet (with every lower id) at the whole write set."""
        return range(self._lafr + 1, self._next_entry_id)

    def unacknowledged(self) -> range:
        """Return the ids added but not yet acknowledged to the application (above LAC)."""
        return range(self._lac + 1, self._next_entry_id)

    def write_set(self, entry_id: int) -> tuple[B, ...]:
        """Return the current write set of held entry `entry_id`."""
        self._held(entry_id)
        return self._write_sets[entry_id - self._base]

    def ack_set(self, entry_id: int) -> frozenset[B]:
        """Return the bookies of the current write set that acked held entry `entry_id`."""
        return frozenset(self._held(entry_id).acked)

    def _held(self, entry_id: int) -> _Run[B]:
        if not self._lafr < entry_id < self._next_entry_id:
            raise InvalidArgumentError(
                "entry is not held", entry_id=entry_id, lafr=self._lafr, next=self._next_entry_id
            )
        return self._runs[bisect_right(self._starts, entry_id, self._head) - 1]

    def _advance_lafr(self) -> None:
        runs = self._runs
        head = self._head
        while head < len(runs) and len(runs[head].acked) == len(runs[head].members):
            self._lafr = runs[head].end - 1
            head += 1
        if head > 64 and head * 2 > len(runs):
            # Forgotten runs leave in one move, not one by one from the front of the lists.
            del runs[:head], self._starts[:head]
            head = 0
        self._head = head
        forgotten = self._lafr + 1 - self._base
        if forgotten > 1024 and forgotten * 2 > len(self._write_sets):
            del self._write_sets[:forgotten]
            self._base = self._lafr + 1
        invariant(self._lafr <= self._lac, "LAFR never passes LAC", lac=self._lac, lafr=self._lafr)


def _spans(ids: list[int]) -> list[tuple[int, int]]:
    """Returns sorted distinct `ids` as spans (first, end) of consecutive ids."""
    spans: list[tuple[int, int]] = []
    low = high = ids[0]
    for entry_id in ids[1:]:
        if entry_id != high + 1:
            spans.append((low, high + 1))
            low = entry_id
        high = entry_id
    spans.append((low, high + 1))
    return spans
