"""Entries as the client builds them for the wire and hands them to the application, and the
values `stream_info` returns."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import NamedTuple

import crc32c

from stream.client.ports import PreparedEntry
from stream.errors import InvalidArgumentError
from stream.metadata.cursors import CursorLag
from stream.metadata.model import AcceptedLoss
from stream.protocol import EntryFlag, entry_checksum
from stream.protocol.checksum import ATTRIBUTES_HEADER, ENTRY_HEADER, encode_attributes
from stream.wire import bookie_pb2 as pb

_ENTRIES_TAG = b"\x3a"
NOOP_TRUNCATE = int(EntryFlag.NOOP | EntryFlag.TRUNCATE)
_NOOP = int(EntryFlag.NOOP)
_ATTRIBUTES = int(EntryFlag.ATTRIBUTES)
_NOOP_OR_ATTRIBUTES = _NOOP | _ATTRIBUTES

# An entry's headers as readers return them: (name, value) pairs in the writer's order.
Headers = tuple[tuple[str, bytes], ...]
# What an application may pass as headers: pairs (names may repeat) or a mapping.
HeadersArg = Iterable[tuple[str, bytes]] | Mapping[str, bytes]
# An entry's key and headers, as `EntryColumns` keeps them for the entries that have some.
Attributes = tuple[bytes | None, Headers]
_NO_HEADERS: Headers = ()
_pack_sequence_only = ATTRIBUTES_HEADER.pack


_SMALL_VARINTS = [bytes([i]) for i in range(0x80)]
# A varint's low group with the continuation bit set; field 1 (entry_id) of ids below 128.
_CONTINUED = [bytes([i | 0x80]) for i in range(0x80)]
_ENTRY_ID_FIELD = [b"\x08" + bytes([i]) for i in range(0x80)]
_new_prepared = tuple.__new__
_pack_header = ENTRY_HEADER.pack
_crc32c = crc32c.crc32c


def varint(value: int) -> bytes:
    """Returns the protobuf varint encoding of `value` (0 <= value < 2**64)."""
    if value < 0x80:
        return _SMALL_VARINTS[value]
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    # Unrolled up to 5 bytes (entry ids up to 2**35, every crc32c): 2-3x the loop's speed.
    low = (value & 0x7F) | 0x80
    if value < 0x200000:
        return bytes((low, ((value >> 7) & 0x7F) | 0x80, value >> 14))
    if value < 0x10000000:
        return bytes(
            (low, ((value >> 7) & 0x7F) | 0x80, ((value >> 14) & 0x7F) | 0x80, value >> 21)
        )
    if value < 0x800000000:
        return bytes(
            (
                low,
                ((value >> 7) & 0x7F) | 0x80,
                ((value >> 14) & 0x7F) | 0x80,
                ((value >> 21) & 0x7F) | 0x80,
                value >> 28,
            )
        )
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def prepare_entry(
    stream_id: int,
    entry_id: int,
    flags: int,
    timestamp_ms: int,
    payload: bytes,
    timestamp_varint: bytes | None = None,
    key: bytes | None = None,
    headers: Headers = _NO_HEADERS,
    sequence: int = 0,
) -> PreparedEntry:
    """Returns the entry with its checksum, encoded as an `Entry` message framed as field 7 of
    an AddRequest, once for every bookie of its write set. With a key, headers or a sequence
    the entry gets flag ATTRIBUTES and them (`headers` as `check_headers` returns them).

    Encoded by hand (fields 1-5 in order, the payload copied once): the same bytes protobuf
    would produce, at a third of the cost (a unit test compares them). `timestamp_varint`
    (`varint(timestamp_ms)`) saves encoding it again for a run of entries with one time."""
    if key is not None or headers:
        return _prepare_attributed(
            stream_id, entry_id, flags, timestamp_ms, payload, key, headers, sequence
        )
    # A sequence alone (every entry of an idempotent producer) stays on the hand-encoded path:
    # field 8 follows the checksum, as protobuf orders it.
    attributes = b""
    sequenced = b""
    if sequence:
        flags |= _ATTRIBUTES
        attributes = _pack_sequence_only(sequence, False, 0)
        sequenced = b"\x40" + varint(sequence)
    crc = entry_checksum(stream_id, entry_id, flags, timestamp_ms, payload, attributes)
    size = len(payload)
    head = b"".join(
        (
            b"\x08",
            varint(entry_id),
            b"\x10" + varint(flags) if flags else b"",
            b"\x18",
            timestamp_varint or varint(timestamp_ms),
            b"\x22",
            varint(size),
        )
    )
    tail = b"\x28" + varint(crc) + sequenced
    framed = b"".join((_ENTRIES_TAG, varint(len(head) + size + len(tail)), head, payload, tail))
    return PreparedEntry(entry_id, framed, size, timestamp_ms)


def _prepare_attributed(
    stream_id: int,
    entry_id: int,
    flags: int,
    timestamp_ms: int,
    payload: bytes,
    key: bytes | None,
    headers: Headers,
    sequence: int,
) -> PreparedEntry:
    """`prepare_entry` of an entry with attributes: rarer, so encoded by protobuf."""
    flags |= _ATTRIBUTES
    attributes = encode_attributes(key, headers, sequence)
    entry = pb.Entry(
        entry_id=entry_id,
        flags=flags,
        timestamp_ms=timestamp_ms,
        payload=payload,
        crc32c=entry_checksum(stream_id, entry_id, flags, timestamp_ms, payload, attributes),
        key=key,
        headers=[pb.Header(name=name, value=value) for name, value in headers],
        sequence=sequence,
    )
    return PreparedEntry.from_entry(entry)


def check_headers(headers: HeadersArg | None) -> Headers:
    """Returns `headers` (pairs or a mapping of str names to bytes-like values) as `Headers`;
    raises `InvalidArgumentError` when a name is not a str or a value not bytes-like."""
    if not headers:
        return _NO_HEADERS
    try:
        pairs = list(headers.items() if isinstance(headers, Mapping) else headers)
    except TypeError:
        raise InvalidArgumentError(
            "headers must be (name, value) pairs or a mapping", type=type(headers).__name__
        ) from None
    checked = []
    for pair in pairs:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise InvalidArgumentError("a header must be a (name, value) pair", header=repr(pair))
        name, value = pair
        if not isinstance(name, str):
            raise InvalidArgumentError("a header name must be a str", name=repr(name))
        if not isinstance(value, bytes | bytearray | memoryview):
            raise InvalidArgumentError(
                "a header value must be bytes", name=name, type=type(value).__name__
            )
        checked.append((name, bytes(value)))
    return tuple(checked)


def check_key(key: bytes | None) -> bytes | None:
    """Returns `key` as bytes (None stays None); raises `InvalidArgumentError` when it is not
    bytes-like."""
    if key is None or type(key) is bytes:
        return key
    if not isinstance(key, bytearray | memoryview):
        raise InvalidArgumentError("key must be bytes", type=type(key).__name__)
    return bytes(key)


def prepare_entries(
    stream_id: int, first_entry_id: int, timestamp_ms: int, payloads: list[bytes]
) -> list[PreparedEntry]:
    """Returns `payloads` prepared as entries `first_entry_id`, `first_entry_id + 1`, ... with
    flags 0 and one timestamp: exactly what `prepare_entry` gives for each (a unit test
    compares them), at a fraction of the cost. What a run shares is encoded once: the
    timestamp, each payload size (with its field tags), the entry id's varint above its low
    7 bits, and the frame header of each entry length."""
    prepared: list[PreparedEntry] = []
    append = prepared.append
    pack = _pack_header
    crc = _crc32c
    join = b"".join
    new = _new_prepared
    continued = _CONTINUED
    stamp_field = b"\x18" + varint(timestamp_ms) + b"\x22"
    middles: dict[int, bytes] = {}  # payload size -> timestamp and size fields
    frames: dict[int, bytes] = {}  # Entry length -> its field-7 tag and length
    high = -1
    id_high = b""
    entry_id = first_entry_id
    for payload in payloads:
        size = len(payload)
        middle = middles.get(size)
        if middle is None:
            middle = middles[size] = stamp_field + varint(size)
        if entry_id < 0x80:
            id_field = _ENTRY_ID_FIELD[entry_id]
        else:
            if entry_id >> 7 != high:
                high = entry_id >> 7
                id_high = varint(high)
            id_field = b"\x08" + continued[entry_id & 0x7F] + id_high
        crc_field = b"\x28" + varint(crc(payload, crc(pack(stream_id, entry_id, 0, timestamp_ms))))
        body = len(id_field) + len(middle) + size + len(crc_field)
        frame = frames.get(body)
        if frame is None:
            frame = frames[body] = _ENTRIES_TAG + varint(body)
        append(
            new(
                PreparedEntry,
                (
                    entry_id,
                    join((frame, id_field, middle, payload, crc_field)),
                    size,
                    timestamp_ms,
                ),
            )
        )
        entry_id += 1
    return prepared


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


class AttributedPayload:
    """A payload queued for append with attributes (a writer queues plain payloads as bytes,
    so those cost nothing more). `len()` is the payload's: what window and fragment
    accounting count."""

    __slots__ = ("payload", "key", "headers", "sequence")

    def __init__(
        self, payload: bytes, key: bytes | None, headers: Headers, sequence: int = 0
    ) -> None:
        self.payload = payload
        self.key = key
        self.headers = headers
        self.sequence = sequence

    def __len__(self) -> int:
        return len(self.payload)


def prepare_sequenced_entries(
    stream_id: int,
    first_entry_id: int,
    timestamp_ms: int,
    payloads: Sequence[AttributedPayload],
) -> list[PreparedEntry]:
    """`prepare_entries` of an idempotent producer's run (each payload an `AttributedPayload`
    with a wire sequence): exactly what `prepare_entry` gives for each, with what the run
    shares (the flags and timestamp fields, the frame of each size) encoded once; a payload
    with a key or headers goes through `prepare_entry`."""
    prepared: list[PreparedEntry] = []
    append = prepared.append
    pack = _pack_header
    pack_attributes = _pack_sequence_only
    crc = _crc32c
    join = b"".join
    flags = _ATTRIBUTES
    middle_field = b"\x10" + varint(flags) + b"\x18" + varint(timestamp_ms) + b"\x22"
    frames: dict[int, bytes] = {}
    entry_id = first_entry_id
    for attributed in payloads:
        sequence = attributed.sequence
        if attributed.key is not None or attributed.headers or not sequence:
            append(
                prepare_entry(
                    stream_id,
                    entry_id,
                    0,
                    timestamp_ms,
                    attributed.payload,
                    key=attributed.key,
                    headers=attributed.headers,
                    sequence=sequence,
                )
            )
            entry_id += 1
            continue
        payload = attributed.payload
        size = len(payload)
        checksum = crc(
            pack_attributes(sequence, False, 0),
            crc(payload, crc(pack(stream_id, entry_id, flags, timestamp_ms))),
        )
        head = b"\x08" + varint(entry_id) + middle_field + varint(size)
        tail = b"\x28" + varint(checksum) + b"\x40" + varint(sequence)
        body = len(head) + size + len(tail)
        frame = frames.get(body)
        if frame is None:
            frame = frames[body] = _ENTRIES_TAG + varint(body)
        append(PreparedEntry(entry_id, join((frame, head, payload, tail)), size, timestamp_ms))
        entry_id += 1
    return prepared


def prepare_mixed_entries(
    stream_id: int,
    first_entry_id: int,
    timestamp_ms: int,
    payloads: Sequence[bytes | AttributedPayload],
) -> list[PreparedEntry]:
    """`prepare_entries` of a run where some payloads are `AttributedPayload`s: the runs of
    plain ones between them still go through `prepare_entries`."""
    prepared: list[PreparedEntry] = []
    start = 0
    for position, payload in enumerate(payloads):
        if type(payload) is AttributedPayload:
            if start < position:
                plain = payloads[start:position]
                prepared += prepare_entries(stream_id, first_entry_id + start, timestamp_ms, plain)
            prepared.append(
                prepare_entry(
                    stream_id,
                    first_entry_id + position,
                    0,
                    timestamp_ms,
                    payload.payload,
                    key=payload.key,
                    headers=payload.headers,
                    sequence=payload.sequence,
                )
            )
            start = position + 1
    if start < len(payloads):
        rest = payloads[start:]
        prepared += prepare_entries(stream_id, first_entry_id + start, timestamp_ms, rest)
    return prepared


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
        headers: list[Headers] = [_NO_HEADERS] * len(self.ids)
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


def write_back_entry(stream_id: int, entry: pb.Entry) -> PreparedEntry:
    """Returns a recovered entry prepared for the recovery write-back. An earlier term's
    NOOP|TRUNCATE goes back as a plain NOOP: its truncation already happened when it was first
    stored, and storing it again on a bookie that holds that term's later, committed entries
    would delete them (found by the simulator)."""
    if entry.flags & EntryFlag.TRUNCATE:
        return prepare_entry(stream_id, entry.entry_id, _NOOP, entry.timestamp_ms, b"")
    return PreparedEntry.from_entry(entry)


def is_noop(entry: pb.Entry) -> bool:
    """Returns whether readers must skip `entry` (flag NOOP)."""
    return bool(entry.flags & _NOOP)


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
        headers: Headers = _NO_HEADERS,
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


@dataclass(frozen=True)
class Fragment:
    """A fragment as `stream_info` shows it: `last_entry_id` is None for the open (last)
    fragment; `bytes` and the first and last entry timestamps are None when unknown (not
    closed by a roll)."""

    first_entry_id: int
    last_entry_id: int | None
    ensemble: list[str]
    bytes: int | None = None
    first_timestamp_ms: int | None = None
    last_timestamp_ms: int | None = None


@dataclass(frozen=True)
class BookieStatus:
    """A bookie of the stream's last fragment as `stream_info` shows it: `state` is
    "available", "read-only" or "down" (not registered); `limbo` whether it holds the stream
    in limbo (None: it did not answer)."""

    bookie_id: str
    state: str
    limbo: bool | None = None


@dataclass(frozen=True)
class StreamInfo:
    """What `stream_info` returns."""

    name: str
    stream_id: int
    term: int
    state: str
    lac: int
    first_entry_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    fragments: list[Fragment]
    writer: str | None = None
    # (term, first entry id of that term), oldest first: where each takeover's term began.
    term_history: list[tuple[int, int]] = field(default_factory=list)
    # The newest accept-loss recoveries (`recover --accept-loss`), oldest first: who gave up
    # which entries, when.
    accepted_losses: list[AcceptedLoss] = field(default_factory=list)
    # The last fragment's bookies, and for a stream IN_RECOVERY what its takeover waits for.
    bookies: list[BookieStatus] = field(default_factory=list)
    waiting_for: str | None = None
    # Each durable cursor's lag behind the LAC, by cursor name.
    cursors: dict[str, CursorLag] = field(default_factory=dict)
