"""entry_checksum: crc32c over the `>QqIq` header then the payload."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream.protocol.checksum import ENTRY_HEADER, entry_checksum


def _table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


TABLE = _table()


def reference_crc32c(data: bytes) -> int:
    """A slow, independent crc32c (Castagnoli, reflected) to check the library and layout."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def test_crc32c_check_value() -> None:
    assert reference_crc32c(b"123456789") == 0xE3069283
    assert crc32c.crc32c(b"123456789") == 0xE3069283


def test_header_layout() -> None:
    assert ENTRY_HEADER.format == ">QqIq"
    assert ENTRY_HEADER.size == 28


def test_golden_value() -> None:
    # Pinned: stored checksums on disk and on the wire depend on this never changing.
    header = bytes.fromhex("0000000000000007000000000000002a000000030000018bcfe56800")
    expected = reference_crc32c(header + b"hello")
    assert entry_checksum(7, 42, 3, 1700000000000, b"hello") == expected == 0x4CB1E4F7


@given(
    st.integers(0, 2**64 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.binary(max_size=64),
)
def test_matches_reference(
    stream_id: int, entry_id: int, flags: int, timestamp_ms: int, payload: bytes
) -> None:
    header = struct.pack(">QqIq", stream_id, entry_id, flags, timestamp_ms)
    expected = reference_crc32c(header + payload)
    assert entry_checksum(stream_id, entry_id, flags, timestamp_ms, payload) == expected
    assert entry_checksum(stream_id, entry_id, flags, timestamp_ms, bytearray(payload)) == expected
    assert entry_checksum(stream_id, entry_id, flags, timestamp_ms, memoryview(payload)) == expected


def test_every_single_bit_flip_changes_the_checksum() -> None:
    fields = (123456789, 987654, 1, 1700000000123)
    payload = b"streamkeeper entry payload"
    base = entry_checksum(*fields, payload)
    for bit in range(len(payload) * 8):
        flipped = bytearray(payload)
        flipped[bit // 8] ^= 1 << (bit % 8)
        assert entry_checksum(*fields, bytes(flipped)) != base, bit
    widths = (64, 63, 32, 63)  # stay inside each field's range
    for position, width in enumerate(widths):
        for bit in range(width):
            changed = list(fields)
            changed[position] ^= 1 << bit
            assert entry_checksum(*changed, payload) != base, (position, bit)


def test_header_fields_are_not_interchangeable() -> None:
    assert entry_checksum(1, 2, 0, 0, b"") != entry_checksum(2, 1, 0, 0, b"")
    # The header is fixed-size, so bytes cannot slide between header and payload.
    assert entry_checksum(0, 0, 0, 0, b"\x00") != entry_checksum(0, 0, 0, 0, b"")


def test_out_of_range_fields_raise() -> None:
    with pytest.raises(struct.error):
        entry_checksum(-1, 0, 0, 0, b"")
    with pytest.raises(struct.error):
        entry_checksum(0, 0, 2**32, 0, b"")
