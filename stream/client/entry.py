"""Entries as the client hands them to the application: one `Entry` each, or `EntryColumns`
for bulk readers, and the reader's check of which entries read from a bookie it accepts."""

from __future__ import annotations

import datetime
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import accumulate, pairwise, repeat
from typing import Any

from stream.framing import native
from stream.framing.encoding import NO_HEADERS, Attributes, Headers
from stream.framing.native import Buffer
from stream.framing.verify import wire_attributes, wire_checksum
from stream.protocol import EntryFlag
from stream.protocol.checksum import ENTRY_HEADER
from stream.wire import bookie_pb2 as pb

_NOOP = int(EntryFlag.NOOP)
_ATTRIBUTES = int(EntryFlag.ATTRIBUTES)
_NOOP_OR_ATTRIBUTES = _NOOP | _ATTRIBUTES
_pack_header = ENTRY_HEADER.pack
_crc32c = native.crc32c


@dataclass(frozen=True, slots=True)
class PackedColumns:
    """Entries' ids, timestamps and payloads laid out as Arrow lays out columns, one buffer
    each: `ids` and `timestamps_ms` native int64s, `offsets` native int32s (one more than the
    entries, the first 0) into `data`, the payloads end to end. What the compiled walker of
    ReadRange answers fills, and what the Spark connector wraps as Arrow arrays without a copy."""

    ids: Buffer
    timestamps_ms: Buffer
    offsets: Buffer
    data: Buffer

    def __len__(self) -> int:
        """Returns how many entries the columns hold."""
        return memoryview(self.offsets).nbytes // 4 - 1

    @classmethod
    def from_lists(
        cls, ids: list[int], payloads: list[bytes], timestamps_ms: list[int]
    ) -> PackedColumns:
        offsets = array("i", [0])
        offsets.extend(accumulate(map(len, payloads)))
        return cls(array("q", ids), array("q", timestamps_ms), offsets, b"".join(payloads))

    def to_lists(self) -> tuple[list[int], list[bytes], list[int]]:
        """Returns (ids, payloads, timestamps_ms) as lists."""
        if native.BUILT:
            payloads = native.split_payloads(self.offsets, self.data)
        else:
            data = bytes(self.data)
            offsets = memoryview(self.offsets).cast("B").cast("i").tolist()
            payloads = [data[a:b] for a, b in pairwise(offsets)]
        return (
            memoryview(self.ids).cast("B").cast("q").tolist(),
            payloads,
            memoryview(self.timestamps_ms).cast("B").cast("q").tolist(),
        )


class EntryColumns:
    """Entries as three parallel columns, no-ops left out: what bulk readers (the Spark
    connector) turn into columns without an `Entry` object per entry. `ids`, `payloads` and
    `timestamps_ms` give them as lists; `packed()` as one buffer each (`PackedColumns`). The
    key and headers of the few entries that have some are kept aside, by position in the
    columns (`attributes`), so entries without attributes cost nothing more; `key_column()`
    and `headers_column()` give them as columns.

    Held in one of the two forms at a time: columns walked from a ReadRange answer come
    packed and become lists the first time a list is asked for (the lists may then be changed
    in place); `packed()` packs lists again each time it is asked."""

    __slots__ = ("_lists", "_packed", "attributes")

    def __init__(
        self,
        ids: list[int],
        payloads: list[bytes],
        timestamps_ms: list[int],
        attributes: dict[int, Attributes],
    ) -> None:
        self._lists: tuple[list[int], list[bytes], list[int]] | None = (
            ids,
            payloads,
            timestamps_ms,
        )
        self._packed: PackedColumns | None = None
        self.attributes = attributes

    @classmethod
    def empty(cls) -> EntryColumns:
        return cls([], [], [], {})

    @classmethod
    def from_packed(cls, packed: PackedColumns, attributes: dict[int, Attributes]) -> EntryColumns:
        columns = cls.__new__(cls)
        columns._lists = None
        columns._packed = packed
        columns.attributes = attributes
        return columns

    def _as_lists(self) -> tuple[list[int], list[bytes], list[int]]:
        if self._lists is None:
            assert self._packed is not None
            self._lists = self._packed.to_lists()
            self._packed = None
        return self._lists

    @property
    def ids(self) -> list[int]:
        return self._as_lists()[0]

    @property
    def payloads(self) -> list[bytes]:
        return self._as_lists()[1]

    @property
    def timestamps_ms(self) -> list[int]:
        return self._as_lists()[2]

    def packed(self) -> PackedColumns:
        """Returns the columns as one buffer each (as they came, or packed from the lists)."""
        if self._packed is not None:
            return self._packed
        assert self._lists is not None
        return PackedColumns.from_lists(*self._lists)

    def __len__(self) -> int:
        return len(self._packed) if self._packed is not None else len(self.ids)

    def __iter__(self) -> Iterator[Any]:
        """Unpacks as (ids, payloads, timestamps_ms, attributes), the lists `verified_columns`
        appends to."""
        return iter((*self._as_lists(), self.attributes))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EntryColumns):
            return NotImplemented
        return (self._as_lists(), self.attributes) == (other._as_lists(), other.attributes)

    def __repr__(self) -> str:
        ids, payloads, timestamps_ms = self._as_lists()
        return f"EntryColumns({ids!r}, {payloads!r}, {timestamps_ms!r}, {self.attributes!r})"

    def extend(self, other: EntryColumns) -> None:
        """Appends `other`'s entries (which follow these)."""
        ids, payloads, timestamps_ms = self._as_lists()
        if other.attributes:
            offset = len(ids)
            self.attributes.update(
                (offset + position, value) for position, value in other.attributes.items()
            )
        ids.extend(other.ids)
        payloads.extend(other.payloads)
        timestamps_ms.extend(other.timestamps_ms)

    def take(self, count: int) -> EntryColumns:
        """Removes the first `count` entries and returns them."""
        ids, payloads, timestamps_ms = self._as_lists()
        attributes = self.attributes
        taken = EntryColumns(ids[:count], payloads[:count], timestamps_ms[:count], {})
        del ids[:count], payloads[:count], timestamps_ms[:count]
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
        keys: list[bytes | None] = [None] * len(self)
        for position, (key, _) in self.attributes.items():
            keys[position] = key
        return keys

    def headers_column(self) -> list[Headers]:
        """Returns each entry's headers (empty: it has none)."""
        headers: list[Headers] = [NO_HEADERS] * len(self)
        for position, (_, entry_headers) in self.attributes.items():
            headers[position] = entry_headers
        return headers

    def to_entries(self, stream: str) -> list[Entry]:
        """Returns the entries as `Entry`s of `stream`."""
        ids, payloads, timestamps_ms = self._as_lists()
        entries = list(map(Entry, repeat(stream), ids, payloads, timestamps_ms))
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
