"""The term rule's durability, judged per bookie: a bookie records a new, higher term durably
(journaled with fsync, with or without `journal_write_data`) before it serves a term-bearing
request with it, so a crash forgets no term it served (docs/design.md §4, "a bookie never
answers with a term it may have forgotten"). Only a lost disk forgets terms, and the bookie's
forgotten-terms bound answers for those.

This is the promise a journal-less bookie keeps through a power cut: it may lose the entries
it had not flushed (the simulator's loss budget covers them), never a term. A journaled
bookie keeps both (`stream.sim.acknowledged` judges its entries). The simulator keeps, for
each bookie, the highest term it answered OK with per stream since it last lost its disk,
and compares it with what the bookie replayed each time it starts, before phase one raises
any term from metadata.
"""

from __future__ import annotations

from collections.abc import Callable

# The property a term a bookie served and forgot in a crash (its disk kept) violates.
BOOKIE_TERMS = "bookie-terms"


class AnsweredTerms:
    """The highest term one bookie answered OK with, by stream (since its disk was last
    lost)."""

    def __init__(self) -> None:
        self._served: dict[int, int] = {}

    def on_served(self, stream_id: int, term: int) -> None:
        """Notes an OK answer to a request of `term` on `stream_id`: the bookie's term for
        the stream was durably at least `term` by then."""
        if term > self._served.get(stream_id, 0):
            self._served[stream_id] = term

    def forget(self) -> None:
        """The disk was lost: the bookie may have forgotten every term."""
        self._served.clear()

    def forgotten(self, term_of: Callable[[int], int | None]) -> list[tuple[int, int, int]]:
        """Returns `(stream_id, served, replayed)` for each stream whose replayed term
        (`term_of`: None for a stream the bookie holds no state for, taken as 0) is below the
        highest one the bookie served."""
        found = []
        for stream_id, served in sorted(self._served.items()):
            replayed = term_of(stream_id) or 0
            if replayed < served:
                found.append((stream_id, served, replayed))
        return found
