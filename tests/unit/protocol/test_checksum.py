"""entry_checksum: crc32c over the `>QqIq` header then the payload."""

from __future__ import annotations

import struct
import subprocess
import sys

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream.protocol.checksum import (
    ATTRIBUTES_HEADER,
    ENTRY_HEADER,
    encode_attributes,
    entry_checksum,
)


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


def test_entries_without_attributes_keep_the_checksum_they_had_before_attributes() -> None:
    # Computed by the entry_checksum of the tree before attributes existed: stored entries
    # must keep verifying.
    assert entry_checksum(7, 42, 0, 1_700_000_000_000, b"hello") == 2964855613
    assert entry_checksum(7, 3, 1, 1_700_000_000_123, b"") == 137511867
    assert entry_checksum(2**63, 2**40, 3, 5, b"x" * 100) == 1935051856
    assert entry_checksum(7, 42, 0, 1_700_000_000_000, b"hello", b"") == 2964855613


def test_attributes_encoding_layout() -> None:
    # Pinned like the header: stored checksums of entries with attributes depend on it.
    assert ATTRIBUTES_HEADER.format == ">qBI"
    assert encode_attributes(None, (), 0) == bytes(13)
    assert encode_attributes(b"", (), 0) == bytes(8) + b"\x01" + bytes(8)
    assert encode_attributes(b"k", [("n", b"vv")], 5) == (
        struct.pack(">qBI", 5, 1, 1) + b"\x00\x00\x00\x01k\x00\x00\x00\x01n" + b"\x00\x00\x00\x02vv"
    )
    assert encode_attributes(None, [("é", b"")], -1) == (
        struct.pack(">qBI", -1, 0, 1) + b"\x00\x00\x00\x02\xc3\xa9" + bytes(4)
    )


def test_attributes_extend_the_crc() -> None:
    attributes = encode_attributes(b"k", [("n", b"v")], 0)
    base = entry_checksum(7, 42, 4, 5, b"hello")
    assert entry_checksum(7, 42, 4, 5, b"hello", attributes) == crc32c.crc32c(attributes, base)
    assert entry_checksum(7, 42, 4, 5, b"hello", attributes) == reference_crc32c(
        ENTRY_HEADER.pack(7, 42, 4, 5) + b"hello" + attributes
    )


@given(
    st.none() | st.binary(max_size=8),
    st.lists(st.tuples(st.text(max_size=4), st.binary(max_size=8)), max_size=3),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.none() | st.binary(max_size=8),
    st.lists(st.tuples(st.text(max_size=4), st.binary(max_size=8)), max_size=3),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
)
def test_different_attributes_encode_differently(
    key: bytes | None,
    headers: list[tuple[str, bytes]],
    sequence: int,
    other_key: bytes | None,
    other_headers: list[tuple[str, bytes]],
    other_sequence: int,
) -> None:
    same = (key, headers, sequence) == (other_key, other_headers, other_sequence)
    assert (
        encode_attributes(key, headers, sequence)
        == encode_attributes(other_key, other_headers, other_sequence)
    ) == same


def test_a_process_imports_the_crc32c_package_only_for_its_first_checksum_here() -> None:
    # Where the compiled module is built, every hot path takes crc32c from it, and the
    # package (about 12 ms to import: its version lookup through importlib.metadata) is
    # loaded only by the first `entry_checksum`. Each Spark query starts a fresh source
    # runner, each `streamctl` call a fresh interpreter: they import the client, not it.
    from stream.framing import native

    if not native.BUILT:
        pytest.skip("the compiled module is not built: the package is what computes crc32c")
    code = (
        "import sys\n"
        "import stream.client.client, stream.client.reader, stream.framing.prepare\n"
        "import stream.bookie.storage.adds, stream.bookie.storage.journal, stream.cli.main\n"
        "print('crc32c' in sys.modules)\n"
        "from stream.protocol import entry_checksum\n"
        "print(entry_checksum(1, 2, 0, 3, b'abc'), 'crc32c' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", str(entry_checksum(1, 2, 0, 3, b"abc")), "True"]
