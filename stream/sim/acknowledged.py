"""The storage engine's own promise, judged per bookie: an entry a journaled bookie answered OK
for is still there after its crash (DESIGN §4: "acks after the sync"). The client's properties
cannot see a single bookie breaking it (the other copies mask the loss), so the simulator
keeps, for each bookie, what it answered since it last lost its disk, and looks again each
time the bookie starts.

Only what the bookie itself was told to drop leaves the set: entries above an answered
Truncate (or a TRUNCATE entry), and entries below its first retained entry (trims, deletes).
Dropping too much only checks less; nothing here can fail a correct bookie.
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

    def on_add(self, request: pb.AddRequest, codes: Iterable[int]) -> None:
        """Notes an answered Add: its OK entries, in order (a TRUNCATE entry drops those
        above it first)."""
        answered = self._answered.setdefault(request.stream_id, set())
        for entry, code in zip(request.entries, codes, strict=False):
            if code != pb.OK:
                continue
            if entry.flags & EntryFlag.TRUNCATE:
                self.on_truncate(request.stream_id, entry.entry_id)
            answered.add(entry.entry_id)

    def on_truncate(self, stream_id: int, after_entry_id: int) -> None:
        """Notes an answered Truncate: the entries above `after_entry_id` may go."""
        answered = self._answered.get(stream_id)
        if answered:
            answered.difference_update([e for e in answered if e > after_entry_id])

    def forget(self) -> None:
        """The disk was lost (or never promised anything): nothing to hold to."""
        self._answered.clear()

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
