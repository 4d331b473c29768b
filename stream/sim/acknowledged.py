"""The storage engine's own promise, judged per bookie: an entry a journaled bookie answered OK
for is still there after its crash (a bookie acknowledges an add only after its journal
sync, docs/design.md). The client's properties cannot see a single bookie breaking it (the
other copies mask the loss), so the simulator keeps, for each bookie, what it answered since
it last lost its disk, and looks again each time the bookie starts.

Only what the bookie itself was told to drop leaves the set: entries above a Truncate (or a
TRUNCATE entry) that reached it, answered or not (a crash may keep the journal record of a
truncation it never answered), and entries below its first retained entry (trims, deletes).
An add that reached the bookie before such a truncation counts only for its entries at or
below it. Dropping too much only checks less; nothing here can fail a correct bookie.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from stream.protocol import EntryFlag
from stream.wire import bookie_pb2 as pb

# The property an entry lost by a journaled bookie that answered OK for it violates.
BOOKIE_DURABILITY = "bookie-durability"


class AnsweredAdds:
    """The entries one bookie answered OK for, by stream (since its disk was last lost)."""

    def __init__(self) -> None:
        self._answered: dict[int, set[int]] = {}
        # Truncations that reached the bookie, by stream: (arrival number, after_entry_id).
        self._truncations: dict[int, list[tuple[int, int]]] = {}
        self._arrivals = 0

    def add_arrived(self, request: pb.AddRequest) -> int:
        """Notes an Add reaching the bookie (its TRUNCATE entries are truncations); returns
        its arrival number, for `on_add`."""
        arrival = self._arrivals
        for entry in request.entries:
            if entry.flags & EntryFlag.TRUNCATE:
                self.truncate_arrived(request.stream_id, entry.entry_id)
        return arrival

    def truncate_arrived(self, stream_id: int, after_entry_id: int) -> None:
        """Notes a truncation reaching the bookie: the entries above `after_entry_id` may go."""
        self._arrivals += 1
        self._truncations.setdefault(stream_id, []).append((self._arrivals, after_entry_id))
        answered = self._answered.get(stream_id)
        if answered:
            answered.difference_update([e for e in answered if e > after_entry_id])

    def on_add(self, request: pb.AddRequest, codes: Iterable[int], arrival: int) -> None:
        """Notes the answer to the Add that arrived as `arrival`: its OK entries that no
        truncation arriving since may have dropped."""
        later = [
            after
            for number, after in self._truncations.get(request.stream_id, ())
            if number > arrival
        ]
        lowest = min(later, default=None)
        answered = self._answered.setdefault(request.stream_id, set())
        for entry, code in zip(request.entries, codes, strict=False):
            if code == pb.OK and (lowest is None or entry.entry_id <= lowest):
                answered.add(entry.entry_id)

    def forget(self) -> None:
        """The disk was lost (or never promised anything): nothing to hold to."""
        self._answered.clear()
        self._truncations.clear()

    def missing(
        self, first_retained: Callable[[int], int], held: Callable[[int, int], bool]
    ) -> list[tuple[int, int]]:
        """Returns the answered `(stream_id, entry_id)` at or above the stream's first
        retained entry that the bookie no longer holds."""
        return sorted(
            (stream_id, entry_id)
            for stream_id, answered in self._answered.items()
            for entry_id in answered
            if entry_id >= first_retained(stream_id) and not held(stream_id, entry_id)
        )
