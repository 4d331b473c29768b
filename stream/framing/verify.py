"""Whether entries read from a bookie are what their writer wrote: the checksum of a wire
`Entry` (its attributes included) and the run of a range answer a reader may use."""

from __future__ import annotations

from collections.abc import Sequence

from stream.framing.encoding import Attributes
from stream.protocol import EntryFlag, entry_checksum
from stream.protocol.checksum import encode_attributes
from stream.wire import bookie_pb2 as pb

_NOOP = int(EntryFlag.NOOP)
_ATTRIBUTES = int(EntryFlag.ATTRIBUTES)


def wire_attributes(entry: pb.Entry) -> Attributes:
    """Returns the key and headers of `entry` (a wire `Entry` with flag ATTRIBUTES)."""
    return (
        entry.key if entry.HasField("key") else None,
        tuple((header.name, header.value) for header in entry.headers),
    )


def wire_checksum(stream_id: int, entry: pb.Entry) -> int:
    """Returns the checksum `entry` (a wire `Entry`) must carry: over its attributes too when
    it has flag ATTRIBUTES."""
    flags = entry.flags
    attributes = b""
    if flags & _ATTRIBUTES:
        key, headers = wire_attributes(entry)
        attributes = encode_attributes(key, headers, entry.sequence)
    return entry_checksum(
        stream_id, entry.entry_id, flags, entry.timestamp_ms, entry.payload, attributes
    )


def checksum_ok(stream_id: int, entry: pb.Entry) -> bool:
    """Returns whether `entry` (as read from a bookie) carries the checksum of its content."""
    return wire_checksum(stream_id, entry) == entry.crc32c


def good_run(stream_id: int, first_entry_id: int, entries: Sequence[pb.Entry]) -> int:
    """Returns how many of `entries` (a ReadRange answer), from the first, are ids
    `first_entry_id`, +1... each with a good checksum: the part a range reader may use."""
    for count, entry in enumerate(entries):
        if entry.entry_id != first_entry_id + count or not checksum_ok(stream_id, entry):
            return count
    return len(entries)


def is_noop(entry: pb.Entry) -> bool:
    """Returns whether readers must skip `entry` (flag NOOP)."""
    return bool(entry.flags & _NOOP)
