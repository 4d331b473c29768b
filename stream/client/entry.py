"""Entries as the client hands them to the application: one `Entry` each, or `EntryColumns`
for bulk readers, and the reader's check of which entries read from a bookie it accepts."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from itertools import repeat
from typing import NamedTuple

import crc32c

from stream.framing.encoding import NO_HEADERS, Attributes, Headers
from stream.framing.verify import wire_attributes, wire_checksum
from stream.protocol import EntryFlag
from stream.protocol.checksum import ENTRY_HEADER
from stream.wire import bookie_pb2 as pb

_NOOP = int(EntryFlag.NOOP)
_ATTRIBUTES = int(EntryFlag.ATTRIBUTES)
_NOOP_OR_ATTRIBUTES = _NOOP | _ATTRIBUTES
_pack_header = ENTRY_HEADER.pack
_crc32c = crc32c.crc32c


class EntryColumns(NamedTuple):
    """Entries as three parallel lists, no-ops left out: what bulk readers (the Spark
    connector) turn into columns without an `Entry` object per entry. The key and headers of
    the few entries that have some are kept aside, by position in the lists (`attributes`),
    so entries without attributes cost nothing more; `key_column()` and `headers_column()`
    give them as columns."""

    ids: list[int]
    payloads: list[bytes]
    timestamps_ms: list[int]
    attributes: dict[int, Attributes]

    @classmethod
    def empty(cls) -> EntryColumns:
        return cls([], [], [], {})

    def extend(self, other: EntryColumns) -> None:
        """Appends `other`'s entries (which follow these)."""
        if other.attributes:
            offset = len(self.ids)
            self.attributes.update(
                (offset + position, value) for position, value in other.attributes.items()
            )
        self.ids.extend(other.ids)
        self.payloads.extend(other.payloads)
        self.timestamps_ms.extend(other.timestamps_ms)

    def take(self, count: int) -> EntryColumns:
        """Removes the first `count` entries and returns them."""
        attributes = self.attributes
        taken = EntryColumns(
            self.ids[:count], self.payloads[:count], self.timestamps_ms[:count], {}
        )
        del self.ids[:count], self.payloads[:count], self.timestamps_ms[:count]
        if attributes:
            kept = {}
            for position, value in attributes.items():
                if position < count:
                    taken.attributes[position] = value
                else:
                    kept[position - count] = value
            attributes.clear()
            attributes.update(kept)
        return taken

    def key_column(self) -> list[bytes | None]:
        """Returns each entry's key (None: it has none)."""
        keys: list[bytes | None] = [None] * len(self.ids)
        for position, (key, _) in self.attributes.items():
            keys[position] = key
        return keys

    def headers_column(self) -> list[Headers]:
        """Returns each entry's headers (empty: it has none)."""
        headers: list[Headers] = [NO_HEADERS] * len(self.ids)
        for position, (_, entry_headers) in self.attributes.items():
            headers[position] = entry_headers
        return headers

    def to_entries(self, stream: str) -> list[Entry]:
        """Returns the entries as `Entry`s of `stream`."""
        entries = list(map(Entry, repeat(stream), self.ids, self.payloads, self.timestamps_ms))
        for position, (key, headers) in self.attributes.items():
            entry = entries[position]
            entry.key = key
            entry.headers = headers
        return entries


def verified_columns(
    stream_id: int,
    first_entry_id: int,
    entries: Iterable[pb.Entry],
    ids: list[int],
    payloads: list[bytes],
    timestamps_ms: list[int],
    attributes: dict[int, Attributes],
) -> int:
    """Returns how many of `entries` (as read from a bookie) are ids `first_entry_id`, +1...
    with a good checksum, counted up to the first that is not; appends the id, payload and
    timestamp of those of them that are not no-ops to `ids`, `payloads` and `timestamps_ms`,
    and the key and headers of those with attributes to `attributes` (by position in `ids`).

    The reader's only definition of which entries it accepts: bulk reads, striped runs and
    single reads all pass through it. One pass over each message's fields, with the checksum
    of `entry_checksum` inlined: the bulk reader's whole per-entry cost in Python."""
    add_id = ids.append
    add_payload = payloads.append
    add_timestamp = timestamps_ms.append
    expected = first_entry_id
    for entry in entries:
        entry_id = entry.entry_id
        flags = entry.flags
        timestamp_ms = entry.timestamp_ms
        payload = entry.payload
        if (
            entry_id != expected
            or _crc32c(payload, _crc32c(_pack_header(stream_id, entry_id, flags, timestamp_ms)))
            != entry.crc32c
        ) and (
            # Attributes are checked only where the short checksum failed: free for the rest.
            entry_id != expected
            or not flags & _ATTRIBUTES
            or wire_checksum(stream_id, entry) != entry.crc32c
        ):
            break
        expected += 1
        if not flags & _NOOP_OR_ATTRIBUTES:
            add_id(entry_id)
            add_payload(payload)
            add_timestamp(timestamp_ms)
        elif not flags & _NOOP:
            attributes[len(ids)] = wire_attributes(entry)
            add_id(entry_id)
            add_payload(payload)
            add_timestamp(timestamp_ms)
    return expected - first_entry_id


class Entry:
    """One entry handed to the application: `stream` (name), `entry_id`, `payload`, the
    writer's wall-clock `timestamp_ms` (`timestamp` gives it as an aware UTC datetime), and
    the `key` (None: none) and `headers` ((name, value) pairs, empty: none) it was appended
    with."""

    __slots__ = ("stream", "entry_id", "payload", "timestamp_ms", "key", "headers")

    def __init__(
        self,
        stream: str,
        entry_id: int,
        payload: bytes,
        timestamp_ms: int,
        key: bytes | None = None,
        headers: Headers = NO_HEADERS,
    ) -> None:
        self.stream = stream
        self.entry_id = entry_id
        self.payload = payload
        self.timestamp_ms = timestamp_ms
        self.key = key
        self.headers = headers

    @property
    def timestamp(self) -> datetime.datetime:
        """Returns the append time as a timezone-aware UTC datetime."""
        return datetime.datetime.fromtimestamp(self.timestamp_ms / 1000, tz=datetime.UTC)

    def __repr__(self) -> str:
        return (
            f"Entry(stream={self.stream!r}, entry_id={self.entry_id}, "
            f"payload={self.payload[:32]!r}{'...' if len(self.payload) > 32 else ''}, "
            f"timestamp_ms={self.timestamp_ms}"
            + (f", key={self.key!r}" if self.key is not None else "")
            + (f", headers={self.headers!r}" if self.headers else "")
            + ")"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Entry):
            return NotImplemented
        return (
            self.stream,
            self.entry_id,
            self.payload,
            self.timestamp_ms,
            self.key,
            self.headers,
        ) == (
            other.stream,
            other.entry_id,
            other.payload,
            other.timestamp_ms,
            other.key,
            other.headers,
        )

    def __hash__(self) -> int:
        return hash((self.stream, self.entry_id))
