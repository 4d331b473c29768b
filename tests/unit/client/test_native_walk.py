"""The compiled walker of ReadRange answers (stream/framing/_native.c) is built by the package's
build and held to the Python definition: on seeded random answers (no-ops, attributes, bad
checksums and id gaps anywhere, fields repeated, out of order or encoded unusually, unknown
fields, empty answers, and bytes truncated or corrupted), `range_answer` over the serialized
answer gives what protobuf and `verified_columns` give over the message, or raises where
protobuf cannot decode it. Answers are placed against an unreadable page, so a read past an
answer's end crashes the test instead of passing unseen."""

from __future__ import annotations

import ctypes
import mmap
import random
from array import array
from collections.abc import Iterator
from typing import Any

import crc32c
import pytest
from google.protobuf.message import DecodeError

from stream.client import range_answer as answers
from stream.client.entry import EntryColumns, PackedColumns, verified_columns
from stream.framing import native
from stream.framing.encoding import varint
from stream.framing.prepare import prepare_entry
from stream.protocol import EntryFlag, entry_checksum
from stream.wire import bookie_pb2 as pb

NOOP = int(EntryFlag.NOOP)
ATTRIBUTES = int(EntryFlag.ATTRIBUTES)
TRUNCATE = int(EntryFlag.TRUNCATE)
I64 = 1 << 63


def test_the_walker_is_built() -> None:
    """`pip install -e .` (scripts/setup.sh) or `setup.py build_ext --inplace` builds it; a
    tree without it reads through the Python definition, slower."""
    assert native.BUILT
    assert answers.use_walker
    # The flag bits it tests are the protocol's.
    assert (native.FLAG_NOOP, native.FLAG_ATTRIBUTES) == (NOOP, ATTRIBUTES)


@pytest.mark.parametrize("hardware", [True, False])
def test_crc32c_is_the_crc32c_packages(hardware: bool) -> None:
    rng = random.Random(7)
    try:
        native.set_hardware_crc(hardware)
        # Around the three-way blocks' sizes too (3 x 256 and 3 x 8192 bytes).
        for size in [*range(40), 767, 768, 775, 1000, 1024, 1543, 4097, 24575, 24576, 24583]:
            data = rng.randbytes(size)
            start = rng.getrandbits(32)
            assert native.crc32c(data) == crc32c.crc32c(data)
            assert native.crc32c(data, start) == crc32c.crc32c(data, start)
            assert native.crc32c(memoryview(data)[1:], start) == crc32c.crc32c(data[1:], start)
    finally:
        native.set_hardware_crc(True)


# ------------------------------------------------------------------ random answers


def _tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def _varint_field(field: int, value: int, rng: random.Random) -> bytes:
    """The field as protobuf writes it or, now and then, as a writer may: a negative value as
    its two's complement, padded with redundant groups, or with high bits a uint32 drops."""
    value &= (1 << 64) - 1
    encoded = varint(value)
    if rng.random() < 0.05 and len(encoded) < 10:
        encoded = bytes(b | 0x80 for b in encoded) + b"\x80" * (9 - len(encoded)) + b"\x00"
    return _tag(field, 0) + encoded


def _bytes_field(field: int, value: bytes) -> bytes:
    return _tag(field, 2) + varint(len(value)) + value


def _plain_entry(
    rng: random.Random, entry_id: int, flags: int, stamp: int, payload: bytes, crc: int
) -> bytes:
    """An Entry of the five plain fields, mostly in protobuf's order and form, sometimes
    shuffled, repeated (the last wins), with defaults left out or values over 32 bits in the
    uint32 fields."""
    fields = [
        [_varint_field(1, entry_id, rng)] if entry_id or rng.random() < 0.5 else [],
        [_varint_field(2, flags | (rng.getrandbits(8) << 32 if rng.random() < 0.05 else 0), rng)]
        if flags or rng.random() < 0.1
        else [],
        [_varint_field(3, stamp, rng)] if stamp or rng.random() < 0.5 else [],
        [_bytes_field(4, payload)] if payload or rng.random() < 0.5 else [],
        [_varint_field(5, crc, rng)] if crc or rng.random() < 0.5 else [],
    ]
    if rng.random() < 0.1:  # an earlier value of a field, overridden by the last
        index = rng.randrange(5)
        stale = _bytes_field(4, b"stale") if index == 3 else _varint_field(index + 1, 12345, rng)
        fields[index].insert(0, stale)
    if rng.random() < 0.1:
        rng.shuffle(fields)
    return b"".join(part for field in fields for part in field)


def _entry_bytes(
    rng: random.Random, stream_id: int, entry_id: int, fault: str
) -> tuple[bytes, int]:
    """One entry as a bookie might return it; returns its bytes and the next id."""
    entry_id = max(-I64, min(entry_id, I64 - 1))
    kind = rng.choice(["plain"] * 8 + ["noop", "noop-truncate", "attributes", "flag-only"])
    payload = rng.randbytes(rng.choice([0, 1, 5, 17, 64, 300]))
    stamp = rng.choice([0, (1_700_000_000_000 + entry_id) % I64, rng.getrandbits(63), -5])
    if kind == "attributes" and entry_id >= 0 and stream_id < 1 << 64 and stamp >= 0:
        key = rng.choice([None, b"", b"key"])
        headers = tuple((f"h{i}", rng.randbytes(3)) for i in range(rng.randrange(3)))
        sequence = rng.choice([0, 0, 1, 2**40])
        if key is None and not headers and not sequence:
            key = b"k"
        message = prepare_entry(
            stream_id, entry_id, 0, stamp, payload, key=key, headers=headers, sequence=sequence
        ).entry()
        if fault == "crc":
            message.crc32c ^= 1 << rng.randrange(32)
        elif fault == "attribute":
            message.key = (message.key if message.HasField("key") else b"") + b"!"
        elif fault == "header":
            message.headers.add(name="extra", value=b"")
        elif fault == "noop":
            message.flags |= NOOP
        return message.SerializeToString(), entry_id + 1
    flags = {"noop": NOOP, "noop-truncate": NOOP | TRUNCATE, "flag-only": ATTRIBUTES}.get(kind, 0)
    crc = entry_checksum(stream_id, entry_id, flags, stamp, payload)
    if fault == "crc":
        crc ^= 1 << rng.randrange(32)
    elif fault == "payload":
        payload += b"!"
    elif fault == "stream":
        crc = entry_checksum(stream_id ^ 1, entry_id, flags, stamp, payload)
    elif fault == "stamp":
        stamp ^= 1
    elif fault == "flags":
        flags ^= NOOP
    body = _plain_entry(rng, entry_id, flags, stamp, payload, crc)
    if fault == "unknown":  # a field this version does not know: protobuf keeps and ignores it
        body += rng.choice([_varint_field(99, 1, rng), _bytes_field(15, b"x"), b"\x4d1234"])
    return body, entry_id + 1


_FAULTS = ["none"] * 30 + ["gap", "repeat", "crc", "payload", "stream", "stamp", "flags"]
_FAULTS += ["unknown", "attribute", "header", "noop"]


def _random_answer(rng: random.Random) -> tuple[int, int, bytes]:
    """A stream id, the first id asked for and a serialized ReadRangeResponse (a quarter of
    them with their bytes corrupted)."""
    stream_id = rng.choice([0, 9, (1 << 64) - 1, rng.getrandbits(64)])
    first = rng.choice([0, 5, I64 - 3, -3, rng.getrandbits(40)])
    parts: list[bytes] = []
    if rng.random() < 0.8:
        parts.append(_varint_field(1, rng.choice([pb.OK] * 5 + [pb.TRIMMED, 0, 99, -1]), rng))
    entry_id = first + rng.choice([0] * 8 + [1, -1])
    for _ in range(rng.choice([0, 1, 2, 5, 20, 60])):
        fault = rng.choice(_FAULTS)
        if fault == "gap":
            entry_id += rng.choice([1, 2, 1000])
        elif fault == "repeat":
            entry_id -= 1
        body, entry_id = _entry_bytes(rng, stream_id, entry_id, fault)
        parts.append(_bytes_field(2, body))
        if rng.random() < 0.03:  # the code or another field between entries
            parts.append(_varint_field(rng.choice([1, 3, 4]), rng.getrandbits(40), rng))
    if rng.random() < 0.3:
        parts.append(_varint_field(3, rng.getrandbits(63), rng))  # lac
    if rng.random() < 0.1:
        parts.append(_varint_field(1, rng.choice([pb.OK, pb.UNKNOWN]), rng))  # the last wins
    if rng.random() < 0.05:
        parts.append(_bytes_field(5, rng.choice([b"bookie says", b"\xff\xfe"])))  # message
    if rng.random() < 0.05:
        parts.append(rng.choice([_bytes_field(77, b"new"), b"\x5b\x08\x01\x5c", b"\x0d1234"]))
    data = b"".join(parts)
    if data and rng.random() < 0.25:
        data = _corrupt(rng, data)
    return stream_id, first, data


def _corrupt(rng: random.Random, data: bytes) -> bytes:
    at = rng.randrange(len(data))
    how = rng.choice(["truncate", "flip", "insert", "delete", "length"])
    if how == "truncate":
        return data[:at]
    if how == "flip":
        return data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1 :]
    if how == "insert":
        return data[:at] + rng.randbytes(rng.randrange(1, 4)) + data[at:]
    if how == "delete":
        return data[:at] + data[at + 1 :]
    return data[:at] + b"\xff\xff\xff\xff\x0f" + data[at:]  # a huge length or tag


class _PageEnd:
    """Places bytes right before a page the process may not read: a read past their end
    faults at once."""

    def __init__(self) -> None:
        self.page = mmap.PAGESIZE
        self._map = mmap.mmap(-1, 2 * self.page)
        address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        if libc.mprotect(address + self.page, self.page, 0) != 0:
            raise OSError(ctypes.get_errno(), "mprotect")

    def place(self, data: bytes) -> memoryview:
        start = self.page - len(data)
        self._map[start : self.page] = data
        return memoryview(self._map)[start : self.page]


_PAGE_END = _PageEnd()


def _expected(stream_id: int, first: int, data: bytes) -> tuple[int, int, int, Any] | None:
    """What protobuf and the Python definition take from `data`; None when it does not
    decode."""
    try:
        response = pb.ReadRangeResponse.FromString(data)
    except DecodeError:
        return None
    columns = EntryColumns.empty()
    accepted = verified_columns(stream_id, first, response.entries, *columns)
    return accepted, len(response.entries), response.code, columns


def _answers(seed: int, count: int) -> Iterator[tuple[int, int, bytes]]:
    rng = random.Random(seed)
    for _ in range(count):
        yield _random_answer(rng)


@pytest.mark.parametrize("seed", range(8))
def test_the_walker_takes_what_the_python_definition_takes(seed: int) -> None:
    walked = fallbacks = undecodable = 0
    for stream_id, first, data in _answers(seed, 400):
        expected = _expected(stream_id, first, data)
        answer = _PAGE_END.place(data) if len(data) <= _PAGE_END.page else data
        if expected is None:
            undecodable += 1
            with pytest.raises(DecodeError):
                answers.range_answer(stream_id, first, answer)  # type: ignore[arg-type]
            continue
        if answers._walk(stream_id, first, answer) is None:  # type: ignore[arg-type]
            fallbacks += 1
        else:
            walked += 1
        got = answers.range_answer(stream_id, first, answer)  # type: ignore[arg-type]
        accepted, entries, code, columns = expected
        assert (got.accepted, got.entries, got.code) == (accepted, entries, code), data
        # The buffers as Arrow takes them, then the same entries as lists.
        packed = got.columns.packed()
        assert len(packed) == len(got.columns) == len(columns.ids)
        assert bytes(packed.ids) == array("q", columns.ids).tobytes()
        assert bytes(packed.timestamps_ms) == array("q", columns.timestamps_ms).tobytes()
        assert bytes(packed.data) == b"".join(columns.payloads)
        assert list(memoryview(packed.offsets).cast("B").cast("i")) == [
            sum(map(len, columns.payloads[:i])) for i in range(len(columns.ids) + 1)
        ]
        assert got.columns == columns
        assert got.columns.to_entries("s") == columns.to_entries("s")
    # The answers exercise all three: walked in C, handed to protobuf, refused.
    assert walked > 250 and fallbacks > 5 and undecodable > 20, (walked, fallbacks, undecodable)


def test_random_bytes_never_crash_the_walker() -> None:
    rng = random.Random(11)
    for _ in range(3000):
        data = rng.randbytes(rng.randrange(0, 64))
        if rng.random() < 0.5:  # mostly entries, so the walker goes past the first tag
            data = b"\x12" + bytes([len(data)]) + data
        expected = _expected(5, 0, data)
        answer = _PAGE_END.place(data)
        if expected is None:
            with pytest.raises(DecodeError):
                answers.range_answer(5, 0, answer)  # type: ignore[arg-type]
        else:
            got = answers.range_answer(5, 0, answer)  # type: ignore[arg-type]
            assert (got.accepted, got.entries, got.code, got.columns) == expected


def test_a_message_and_an_unbuilt_walker_take_the_python_definition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for stream_id, first, data in _answers(3, 200):
        expected = _expected(stream_id, first, data)
        if expected is None:
            continue
        message = pb.ReadRangeResponse.FromString(data)
        assert tuple(answers.range_answer(stream_id, first, message)[1:]) == expected[:3]
        with monkeypatch.context() as patch:
            patch.setattr(answers, "use_walker", False)
            got = answers.range_answer(stream_id, first, data)
        assert (got.accepted, got.entries, got.code, got.columns) == expected


def test_the_walker_refuses_columns_that_do_not_line_up() -> None:
    entry = prepare_entry(1, 0, 0, 5, b"abc").framed[1:]  # field 7 of AddRequest -> field 2
    data = b"\x12" + entry
    good = (bytearray(), bytearray(), bytearray(4), bytearray())
    walked = native.walk_range(data, 1, 0, 0, False, 0, 0, 0, *good)
    assert walked[:3] == (native.DONE, len(data), 1)
    for columns in [
        (bytearray(), bytearray(), bytearray(), bytearray()),  # offsets without the first 0
        (bytearray(8), bytearray(), bytearray(8), bytearray()),
        (bytearray(3), bytearray(3), bytearray(4), bytearray()),
    ]:
        with pytest.raises(ValueError):
            native.walk_range(data, 1, 0, 0, False, 0, 0, 0, *columns)
    with pytest.raises(ValueError):
        native.walk_range(data, 1, 0, 0, False, len(data) + 1, 0, 0, *good)
    with pytest.raises(TypeError):
        native.walk_range(data, 1, 0, 0, False, 0, 0, 0, b"", b"", b"\0\0\0\0", b"")
    with pytest.raises(OverflowError):
        native.walk_range(data, 1 << 64, 0, 0, False, 0, 0, 0, *good)


def test_packed_columns_split_back_into_payloads() -> None:
    packed = PackedColumns.from_lists([3, 4, 5], [b"ab", b"", b"cde"], [7, 8, 9])
    assert len(packed) == 3
    assert native.split_payloads(packed.offsets, packed.data) == [b"ab", b"", b"cde"]
    assert packed.to_lists() == ([3, 4, 5], [b"ab", b"", b"cde"], [7, 8, 9])
    for offsets in [array("i", [1, 2]), array("i", [0, 3, 2]), array("i", [0, 9]), b"\0\0"]:
        with pytest.raises(ValueError):
            native.split_payloads(offsets, b"abcde")
    columns = EntryColumns.from_packed(packed, {1: (b"k", ())})
    assert len(columns) == 3 and columns.key_column() == [None, b"k", None]
    assert columns.ids == [3, 4, 5]  # now lists: they may be changed in place
    columns.ids.append(6)
    columns.payloads.append(b"f")
    columns.timestamps_ms.append(10)
    assert columns.packed().to_lists() == ([3, 4, 5, 6], [b"ab", b"", b"cde", b"f"], [7, 8, 9, 10])
