"""The buffers a reading client receives range answers into over the data ports, reused once
nobody holds them.

A range's answers are about `range_batch_bytes` each (8 MiB for Spark's reads). A new
bytearray per answer was zeroed and then filled, and its memory was new to the process each
time: glibc hands large freed blocks back to the kernel, so every answer's pages were faulted
in and cleared again; the payload column the walker builds from each answer, as large, too.
Reading 200,000 entries of 1 KiB, the reader's CPU per entry was a fifth to a third higher
(docs/benchmarks.md, "A reader's answers in reused buffers").

Only answers from `_KEPT_FROM_BYTES` use kept buffers (the Spark connector's 8 MiB ones; the
default `range_batch_bytes` is 1 MiB). A client then keeps up to `_KEPT` buffers for the
answers it receives and `_KEPT` for its readers' payload columns: about 37 MiB with 8 MiB
answers. Each set is used on the client's event loop only.
"""

from __future__ import annotations

import sys

from stream.framing import native

# Answers from this size get kept buffers: a range's first answer (`range_first_entries`) and
# its last, short ones, get new ones.
_KEPT_FROM_BYTES = 2 << 20
# Buffers kept per set: one being filled while the caller still holds the last (a received
# answer being walked, a column in an Arrow batch); more are new when all are held. Three
# measured no better than two (docs/benchmarks.md).
_KEPT = 2
# Room kept above a new buffer's first size: answers end at an entry's end, so their sizes
# differ by up to an entry from one to the next.
_HEADROOM = 8  # an eighth


def sized_buffer_python(buffer: bytearray | None, size: int) -> bytearray:
    """`native.sized_buffer` in Python: `buffer` resized to `size` bytes in place (its first
    bytes kept; added ones zeroed here, left as they are in memory by the compiled step), or a
    new bytearray of `size` bytes when `buffer` is None. A buffer exported (a memoryview of
    it) raises BufferError and is left as it was."""
    if size < 0:
        raise ValueError("the size must not be negative")
    if buffer is None:
        return bytearray(size)
    if size <= len(buffer):
        del buffer[size:]
    else:
        buffer.extend(bytes(size - len(buffer)))
    return buffer


sized_buffer = native.sized_buffer if native.BUILT else sized_buffer_python


class AnswerBuffers:
    """Receive buffers for answers, kept and handed out again once nobody holds them."""

    def __init__(self) -> None:
        self._kept: list[bytearray] = []

    def take(self, size: int, room: int = 0) -> bytearray:
        """Returns a bytearray of `size` bytes, its contents unspecified (to be filled whole),
        with room for `room` bytes (at least `size`) in its allocation: a kept one that nobody
        holds and whose allocation takes `room` and is at most twice that, else a new one (kept
        when large, in place of a kept one nobody holds)."""
        room = max(size, room)
        if room < _KEPT_FROM_BYTES:
            return sized_buffer(None, size)
        kept = self._kept
        free = -1
        for i in range(len(kept)):  # not enumerate: its reused tuple would hold a reference
            buffer = kept[i]
            # Referenced by the list, this frame and getrefcount's argument alone: nobody else
            # holds it, a memoryview of it included (a view references what it views).
            if sys.getrefcount(buffer) == 3:
                # Not more than twice the room: a bytearray resized below half of its
                # allocation is reallocated smaller (PyByteArray_Resize), and kept buffers
                # would shrink.
                if room < buffer.__alloc__() <= 2 * room:
                    return sized_buffer(buffer, size)
                free = i
        fresh = sized_buffer(sized_buffer(None, room + room // _HEADROOM), size)
        if len(kept) < _KEPT:
            kept.append(fresh)
        elif free >= 0:
            kept[free] = fresh
        return fresh
