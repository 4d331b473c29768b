"""How far a cursor is behind the LAC, in entries and in bytes as the fragments record them:
pure arithmetic on a stream's metadata, for the client and the retention service alike."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stream.metadata.model import Fragment


@dataclass(frozen=True)
class CursorLag:
    """How far a cursor is behind the LAC: `entries` (no-op entries included) and `bytes`
    (payload bytes as fragments record them; None when nothing tells, see `cursor_lag`)."""

    position: int | None
    lac: int
    entries: int
    bytes: int | None
    # When the position was committed (wall clock), None when unknown.
    committed_ms: int | None = None


def fragment_end(fragments: Sequence[Fragment], index: int, lac: int) -> int:
    """Returns the last entry id of fragment `index`: recorded when closed, else the one before
    the next fragment, else (the open last fragment) the LAC."""
    fragment = fragments[index]
    if fragment.last_entry_id is not None:
        return fragment.last_entry_id
    if index + 1 < len(fragments):
        return fragments[index + 1].first_entry_id - 1
    return lac


def bytes_after(fragments: Sequence[Fragment], entry_id: int, lac: int) -> int | None:
    """Returns the payload bytes of the entries after `entry_id` up to the LAC. A fragment with
    a recorded size counts its share pro rata (entries after `entry_id` over its entries); the
    open last fragment has no recorded size, so its entries count at the average entry size
    of the sized fragments. None when some entries count and no fragment has a size."""
    sized_bytes = sized_entries = 0
    for index, fragment in enumerate(fragments):
        if fragment.bytes is not None:
            sized_bytes += fragment.bytes
            sized_entries += fragment_end(fragments, index, lac) - fragment.first_entry_id + 1
    total = 0.0
    for index, fragment in enumerate(fragments):
        end = min(fragment_end(fragments, index, lac), lac)
        after = end - max(fragment.first_entry_id, entry_id + 1) + 1
        if after <= 0:
            continue
        if fragment.bytes is not None:
            total += fragment.bytes * after / (end - fragment.first_entry_id + 1)
        elif sized_entries > 0:
            total += sized_bytes * after / sized_entries
        else:
            return None
    return round(total)


def cursor_lag(
    position: int | None,
    lac: int,
    first_entry_id: int,
    fragments: Sequence[Fragment],
    committed_ms: int | None = None,
) -> CursorLag:
    """Returns the lag of a cursor at `position` (None: never committed, so everything retained
    is ahead of it) on a stream with `lac`, first retained entry and `fragments`."""
    done = first_entry_id - 1 if position is None else max(position, first_entry_id - 1)
    entries = max(0, lac - done)
    lag_bytes = bytes_after(fragments, done, lac) if entries else 0
    return CursorLag(position, lac, entries, lag_bytes, committed_ms)
