"""The protobuf wire encoding the client writes by hand and the bookie answers in: varints, the
frame tag of an entry inside an AddRequest, and an entry's attributes as Python values."""

from __future__ import annotations

# Field 7 (`entries`) of AddRequest, wire type 2 (length-delimited): (7 << 3) | 2.
ENTRIES_TAG = b"\x3a"

# An entry's headers as readers return them: (name, value) pairs in the writer's order.
Headers = tuple[tuple[str, bytes], ...]
# An entry's key and headers, as `EntryColumns` keeps them for the entries that have some.
Attributes = tuple[bytes | None, Headers]
NO_HEADERS: Headers = ()

_SMALL_VARINTS = [bytes([i]) for i in range(0x80)]


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
