"""The entry checksum: crc32c over a fixed big-endian header, continued over the payload and,
for an entry with flag ATTRIBUTES, over an encoding of its attributes."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

# stream_id u64, entry_id i64, flags u32, timestamp_ms i64. Part of the wire and disk format:
# changing it invalidates every stored checksum.
ENTRY_HEADER = struct.Struct(">QqIq")
# The attributes' encoding, also part of the format: sequence i64, key present u8, header
# count u32; then the key (when present) and each header's name (UTF-8) and value, every one
# as u32 length + bytes.
ATTRIBUTES_HEADER = struct.Struct(">qBI")
_LENGTH = struct.Struct(">I")

_pack_header = ENTRY_HEADER.pack
_pack_length = _LENGTH.pack
_crc32c: Callable[[bytes | bytearray | memoryview, int], int] | None = None


def _load_crc32c() -> Callable[[bytes | bytearray | memoryview, int], int]:
    """Imports the crc32c package on the first checksum computed here. The hot paths take
    crc32c from the compiled module (`stream.framing.native`), a layer above this one, and a
    process that never calls `entry_checksum` (a Spark source runner, `streamctl`) does not
    pay the package's import, about 12 ms (its version lookup through importlib.metadata)."""
    global _crc32c
    from crc32c import crc32c

    _crc32c = crc32c
    return crc32c


def entry_checksum(
    stream_id: int,
    entry_id: int,
    flags: int,
    timestamp_ms: int,
    payload: bytes | bytearray | memoryview,
    attributes: bytes = b"",
) -> int:
    """Return the crc32c (unsigned 32-bit) of the entry header followed by `payload` and
    then `attributes` (`encode_attributes`; empty for an entry without flag ATTRIBUTES, whose
    checksum is thus the one entries had before attributes existed).

    Raises `struct.error` when a header field is out of its range. Called once per entry on
    the writer, bookie and reader paths: kept to two C calls on purpose."""
    crc32c = _crc32c or _load_crc32c()
    crc = crc32c(payload, crc32c(_pack_header(stream_id, entry_id, flags, timestamp_ms), 0))
    return crc32c(attributes, crc) if attributes else crc


def encode_attributes(
    key: bytes | None, headers: Iterable[tuple[str, bytes]], sequence: int
) -> bytes:
    """Returns the bytes the checksum of an entry with flag ATTRIBUTES continues over: never
    empty, and different for an absent and an empty key."""
    parts = [b""]
    count = 0
    if key is not None:
        parts.append(_pack_length(len(key)))
        parts.append(key)
    for name, value in headers:
        encoded = name.encode()
        parts += (_pack_length(len(encoded)), encoded, _pack_length(len(value)), value)
        count += 1
    parts[0] = ATTRIBUTES_HEADER.pack(sequence, key is not None, count)
    return b"".join(parts)
