"""Entries framed for the wire: each `Entry` message encoded once with its checksum, framed as
field 7 of an AddRequest, and reused for every bookie of its write set and every resend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from stream.framing import native
from stream.framing.encoding import ENTRIES_TAG, NO_HEADERS, Headers, varint
from stream.protocol import EntryFlag, entry_checksum
from stream.protocol.checksum import ATTRIBUTES_HEADER, ENTRY_HEADER, encode_attributes
from stream.wire import bookie_pb2 as pb

NOOP_TRUNCATE = int(EntryFlag.NOOP | EntryFlag.TRUNCATE)
_NOOP = int(EntryFlag.NOOP)
_ATTRIBUTES = int(EntryFlag.ATTRIBUTES)
_pack_sequence_only = ATTRIBUTES_HEADER.pack
# A varint's low group with the continuation bit set; field 1 (entry_id) of ids below 128.
_CONTINUED = [bytes([i | 0x80]) for i in range(0x80)]
_ENTRY_ID_FIELD = [b"\x08" + bytes([i]) for i in range(0x80)]
_new_prepared = tuple.__new__
_pack_header = ENTRY_HEADER.pack
_crc32c = native.crc32c
# Whether `prepare_entries` uses the compiled loop (tests turn it off to run the definition).
use_native = native.BUILT


class PreparedEntry(NamedTuple):
    """One entry ready for the wire: its id, its `Entry` message serialized and framed as
    field 7 of an AddRequest (tag + length + bytes), built once and reused for every bookie of
    the write set and every resend, and the payload size (fragment and window accounting).

    A named tuple: built per append, and `tuple.__new__` (see `prepare_entries`) costs
    a fraction of a Python `__init__`."""

    entry_id: int
    framed: bytes
    payload_bytes: int
    timestamp_ms: int

    @classmethod
    def from_entry(cls, entry: pb.Entry) -> PreparedEntry:
        """Returns `entry` (a wire `Entry`, checksum already set) prepared for sending."""
        body = entry.SerializeToString()
        return cls(
            entry.entry_id,
            ENTRIES_TAG + varint(len(body)) + body,
            len(entry.payload),
            entry.timestamp_ms,
        )

    def entry(self) -> pb.Entry:
        """Returns the wire `Entry` this was prepared from (decoded again: for simulators and
        tests, never on the hot path)."""
        return pb.AddRequest.FromString(self.framed).entries[0]


def prepare_entry(
    stream_id: int,
    entry_id: int,
    flags: int,
    timestamp_ms: int,
    payload: bytes,
    timestamp_varint: bytes | None = None,
    key: bytes | None = None,
    headers: Headers = NO_HEADERS,
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
    framed = b"".join((ENTRIES_TAG, varint(len(head) + size + len(tail)), head, payload, tail))
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


def prepare_entries(
    stream_id: int, first_entry_id: int, timestamp_ms: int, payloads: list[bytes]
) -> list[PreparedEntry]:
    """Returns `payloads` prepared as entries `first_entry_id`, `first_entry_id + 1`, ... with
    flags 0 and one timestamp: exactly what `prepare_entry` gives for each (a unit test
    compares them). Compiled where `native` was built (a tenth of the cost: no bytecode per
    entry; tests/unit/client/test_native_prepare.py holds it to `prepare_entries_python`)."""
    if use_native:
        return native.prepare_entries(
            stream_id, first_entry_id, timestamp_ms, payloads, PreparedEntry
        )
    return prepare_entries_python(stream_id, first_entry_id, timestamp_ms, payloads)


def prepare_entries_python(
    stream_id: int, first_entry_id: int, timestamp_ms: int, payloads: list[bytes]
) -> list[PreparedEntry]:
    """`prepare_entries` in Python, the definition the compiled one is held to, at a fraction
    of `prepare_entry`'s cost. What a run shares is encoded once: the timestamp, each payload
    size (with its field tags), the entry id's varint above its low 7 bits, and the frame
    header of each entry length."""
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
            frame = frames[body] = ENTRIES_TAG + varint(body)
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
            frame = frames[body] = ENTRIES_TAG + varint(body)
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
    plain: list[bytes] = []
    for position, payload in enumerate(payloads):
        if isinstance(payload, AttributedPayload):
            if plain:
                first = first_entry_id + position - len(plain)
                prepared += prepare_entries(stream_id, first, timestamp_ms, plain)
                plain = []
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
        else:
            plain.append(payload)
    if plain:
        first = first_entry_id + len(payloads) - len(plain)
        prepared += prepare_entries(stream_id, first, timestamp_ms, plain)
    return prepared


def write_back_entry(stream_id: int, entry: pb.Entry) -> PreparedEntry:
    """Returns a recovered entry prepared for the recovery write-back. An earlier term's
    NOOP|TRUNCATE goes back as a plain NOOP: its truncation already happened when it was first
    stored, and storing it again on a bookie that holds that term's later, committed entries
    would delete them (found by the simulator)."""
    if entry.flags & EntryFlag.TRUNCATE:
        return prepare_entry(stream_id, entry.entry_id, _NOOP, entry.timestamp_ms, b"")
    return PreparedEntry.from_entry(entry)
