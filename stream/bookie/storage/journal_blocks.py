"""How the journal lays out what it writes (version 3 files): in whole blocks of a page-aligned
buffer, so that it can be written with O_DIRECT and no write covers part of a block.

A file's first block holds its header; a group commit's records follow one another and a
padding record (REC_PAD, zeros) ends the group on a block boundary.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable

from stream.bookie.storage.codec import (
    JOURNAL_BLOCK,
    JOURNAL_FILE_HEADER,
    JOURNAL_MAGIC,
    JOURNAL_RECORD_PREFIX,
    REC_PAD,
)
from stream.framing import native

_crc32c = native.crc32c
_pack_prefix_into = JOURNAL_RECORD_PREFIX.pack_into
_PREFIX = JOURNAL_RECORD_PREFIX.size
# A padding record's payload is at most the rest of a block and one more block (when the rest
# is too short for a record's prefix).
_ZEROS = bytes(2 * JOURNAL_BLOCK)
# The buffer's first size; a larger group gets a larger one.
_BUFFER_BYTES = 2 << 20

MARK = 0  # a pending item's type when it is a checkpoint mark (written nowhere)


def padded(size: int) -> int:
    """Returns the size of a group whose records take `size` bytes: up to the next block
    boundary, with room for a padding record's prefix."""
    rest = -size % JOURNAL_BLOCK
    if rest == 0:
        return size
    return size + rest + (JOURNAL_BLOCK if rest < _PREFIX else 0)


class Blocks:
    """The journal thread's buffer."""

    def __init__(self) -> None:
        self._buffer = mmap.mmap(-1, _BUFFER_BYTES)

    def header(self, seq: int) -> memoryview:
        """Returns file `seq`'s first block."""
        buffer = self._buffer
        buffer[:JOURNAL_BLOCK] = _ZEROS[:JOURNAL_BLOCK]
        JOURNAL_FILE_HEADER.pack_into(buffer, 0, JOURNAL_MAGIC, seq)
        return memoryview(buffer)[:JOURNAL_BLOCK]

    def group(
        self,
        items: list[tuple[int, object]],
        type_crc: dict[int, int],
        on_mark: Callable[[object, int], None],
    ) -> tuple[memoryview, int]:
        """Lays out the records of `items` (pairs of a record type and its payload, or MARK
        and a mark) and their padding; calls `on_mark(mark, at)` with each mark's offset in
        the group. Returns the group's blocks and its record count."""
        size = padded(
            sum(len(payload) + _PREFIX for kind, payload in items if kind != MARK)  # type: ignore[misc, arg-type]
        )
        if size > len(self._buffer):
            self._buffer = mmap.mmap(-1, size)
        buffer = self._buffer
        at = 0
        records = 0
        for record_type, payload in items:
            if record_type == MARK:
                on_mark(payload, at)
                continue
            assert isinstance(payload, bytes)
            length = len(payload)
            crc = _crc32c(payload, type_crc[record_type])
            _pack_prefix_into(buffer, at, length + 1, crc, record_type)
            at += _PREFIX
            buffer[at : at + length] = payload
            at += length
            records += 1
        if at < size:
            pad = size - at - _PREFIX
            zeros = memoryview(_ZEROS)[:pad]
            _pack_prefix_into(buffer, at, pad + 1, _crc32c(zeros, type_crc[REC_PAD]), REC_PAD)
            buffer[at + _PREFIX : size] = zeros
        return memoryview(buffer)[:size], records
