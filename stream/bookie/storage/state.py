"""Per-stream state kept by a bookie: term, limbo, LAC/LAFR, last entry held and first
retained entry. Mutated only on the event-loop thread; persisted at each flush."""

from __future__ import annotations

from dataclasses import dataclass

from stream.bookie.storage.codec import STREAM_STATE

_pack = STREAM_STATE.pack
_unpack = STREAM_STATE.unpack


class LocalStreamState:
    """The mutable state of one stream (see `StreamStateView` for the fields)."""

    __slots__ = ("term", "limbo", "lac", "lafr", "last_entry_id", "first_entry_id")

    def __init__(
        self,
        term: int = 0,
        limbo: bool = False,
        lac: int = -1,
        lafr: int = -1,
        last_entry_id: int = -1,
        first_entry_id: int = 0,
    ) -> None:
        self.term = term
        self.limbo = limbo
        self.lac = lac
        self.lafr = lafr
        self.last_entry_id = last_entry_id
        self.first_entry_id = first_entry_id

    def pack(self) -> bytes:
        """Returns the state in its LMDB form."""
        return _pack(
            self.term,
            1 if self.limbo else 0,
            self.lac,
            self.lafr,
            self.last_entry_id,
            self.first_entry_id,
        )

    @classmethod
    def unpack(cls, raw: bytes) -> LocalStreamState:
        """Returns the state stored as `raw`."""
        term, limbo, lac, lafr, last_entry_id, first_entry_id = _unpack(raw)
        return cls(term, bool(limbo), lac, lafr, last_entry_id, first_entry_id)

    def view(self) -> StreamStateView:
        """Returns an immutable copy."""
        return StreamStateView(
            self.term, self.limbo, self.lac, self.lafr, self.last_entry_id, self.first_entry_id
        )


@dataclass(frozen=True, slots=True)
class StreamStateView:
    """What a bookie knows of one stream.

    term: highest term recorded (0 never happens for a known stream created by a term-bearing
    request; a stream created by set_limbo without a term has 0). limbo: explicit negatives
    are answered UNKNOWN. lac/lafr: highest LAC/LAFR a writer reported (-1: none).
    last_entry_id: highest entry id held (-1: none; trims do not lower it). first_entry_id:
    first retained entry (entries below were trimmed)."""

    term: int
    limbo: bool
    lac: int
    lafr: int
    last_entry_id: int
    first_entry_id: int
