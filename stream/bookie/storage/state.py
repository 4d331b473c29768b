"""Per-stream state kept by a bookie: term, limbo, LAC/LAFR, last entry held, first retained
entry and the last Truncate applied. Mutated only on the event-loop thread; persisted at each
flush."""

from __future__ import annotations

from dataclasses import dataclass

from stream.bookie.storage.codec import STREAM_STATE, STREAM_STATE_TRUNCATED

_pack = STREAM_STATE_TRUNCATED.pack
_unpack = STREAM_STATE_TRUNCATED.unpack
_unpack_untruncated = STREAM_STATE.unpack
_UNTRUNCATED_BYTES = STREAM_STATE.size


class LocalStreamState:
    """The mutable state of one stream (see `StreamStateView` for the fields)."""

    __slots__ = (
        "term",
        "limbo",
        "lac",
        "lafr",
        "last_entry_id",
        "first_entry_id",
        "truncate_term",
        "truncate_after",
    )

    def __init__(
        self,
        term: int = 0,
        limbo: bool = False,
        lac: int = -1,
        lafr: int = -1,
        last_entry_id: int = -1,
        first_entry_id: int = 0,
        truncate_term: int = 0,
        truncate_after: int = -1,
    ) -> None:
        self.term = term
        self.limbo = limbo
        self.lac = lac
        self.lafr = lafr
        self.last_entry_id = last_entry_id
        self.first_entry_id = first_entry_id
        # The last Truncate applied (term 0: none), so that a stale one is told apart
        # (`stream.protocol.truncation`).
        self.truncate_term = truncate_term
        self.truncate_after = truncate_after

    def pack(self) -> bytes:
        """Returns the state in its LMDB form."""
        return _pack(
            self.term,
            1 if self.limbo else 0,
            self.lac,
            self.lafr,
            self.last_entry_id,
            self.first_entry_id,
            self.truncate_term,
            self.truncate_after,
        )

    @classmethod
    def unpack(cls, raw: bytes) -> LocalStreamState:
        """Returns the state stored as `raw` (also in the form without the last Truncate)."""
        if len(raw) == _UNTRUNCATED_BYTES:
            term, limbo, lac, lafr, last_entry_id, first_entry_id = _unpack_untruncated(raw)
            return cls(term, bool(limbo), lac, lafr, last_entry_id, first_entry_id)
        fields = _unpack(raw)
        return cls(fields[0], bool(fields[1]), *fields[2:])

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
