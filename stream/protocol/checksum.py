"""The entry checksum: crc32c over a fixed big-endian header, continued over the payload."""

from __future__ import annotations

import struct

import crc32c

# stream_id u64, entry_id i64, flags u32, timestamp_ms i64. Part of the wire and disk format:
# changing it invalidates every stored checksum.
ENTRY_HEADER = struct.Struct(">QqIq")

_pack_header = ENTRY_HEADER.pack
_crc32c = crc32c.crc32c


def entry_checksum(
    stream_id: int,
    entry_id: int,
    flags: int,
    timestamp_ms: int,
    payload: bytes | bytearray | memoryview,
) -> int:
    """Return the crc32c (unsigned 32-bit) of the entry header followed by `payload`.

    Raises `struct.error` when a header field is out of its range. Called once per entry on
    the writer, bookie and reader paths: kept to two C calls on purpose.
    """
    return _crc32c(payload, _crc32c(_pack_header(stream_id, entry_id, flags, timestamp_ms)))
