"""A bookie's ReadRange answer, framed by hand from the entries as the entry logs and write
caches store them (serialized): no entry is parsed and built again, and a run of records read
from an entry log with one pread is framed in one compiled step (`frame_records`, _native.c),
without a bytes object per entry. `frame_records_python` is the definition the compiled step is
held to (tests/unit/bookie/test_range_answer.py) and the fallback where it is not built."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import sub

from stream.framing import native
from stream.framing.encoding import varint
from stream.wire import bookie_pb2 as pb

# ReadRangeResponse.entries: field 2, wire type 2 (length-delimited). A repeated field may
# follow the response's other fields on the wire, so the entries go after its head.
ENTRIES_TAG = 0x12
_ENTRIES_FIELD = bytes([ENTRIES_TAG])


class _Frames(dict[int, bytes]):
    """Record length -> the field tag and length varint that frame a record of that length
    as one of `entries` (made once per length; forgotten when too many lengths were seen)."""

    def __missing__(self, length: int) -> bytes:
        if len(self) >= 4096:
            self.clear()
        frame = self[length] = _ENTRIES_FIELD + varint(length)
        return frame


_FRAMES = _Frames()


def frame_records_python(
    span: bytes, base: int, offsets: Sequence[int], lengths: Sequence[int], head: bytes = b""
) -> bytes:
    """Returns `head`, then each record span[offset - base : offset - base + length] framed as
    one of `entries`, as one bytes object; a record outside the span raises ValueError."""
    if len(offsets) != len(lengths):
        raise ValueError("offsets and lengths differ in length")
    if base < 0:
        raise ValueError("base must not be negative")
    starts = list(map(sub, offsets, repeat(base)))
    for i, (start, length) in enumerate(zip(starts, lengths, strict=True)):
        if start < 0 or length < 0 or start + length > len(span):
            raise ValueError(
                f"record {i} (offset {start + base}, length {length}) is outside the span "
                f"(base {base}, {len(span)} bytes)"
            )
    parts: list[bytes] = [b""] * (2 * len(starts))
    parts[0::2] = map(_FRAMES.__getitem__, lengths)
    parts[1::2] = (span[start : start + n] for start, n in zip(starts, lengths, strict=True))
    return b"".join([head, *parts])


def frame_records(
    span: bytes, base: int, offsets: Sequence[int], lengths: Sequence[int], head: bytes = b""
) -> bytes:
    """`frame_records_python`, compiled where the module is built."""
    if native.BUILT:
        return native.frame_records(span, base, offsets, lengths, ENTRIES_TAG, head)
    return frame_records_python(span, base, offsets, lengths, head)


class FramedEntries:
    """One answer's entries, framed as ReadRangeResponse.entries, in pieces to be joined once
    (`with_head`), and how many entries they hold. An answer read as one span of an entry log
    (the usual one) is framed with its head in one step: its 4 MiB are copied once, not twice."""

    __slots__ = ("count", "pieces", "_span")

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.count = 0
        # The answer's only entries so far, a span not framed yet: (span, base, offsets,
        # lengths), framed after the head by `with_head`.
        self._span: tuple[bytes, int, Sequence[int], Sequence[int]] | None = None

    def _frame_span(self) -> None:
        if self._span is not None:
            self.pieces.append(frame_records(*self._span))
            self._span = None

    def __len__(self) -> int:
        return self.count

    def append(self, record: bytes) -> None:
        """Adds one serialized entry."""
        self._frame_span()
        self.pieces += (_FRAMES[len(record)], record)
        self.count += 1

    def add_span(
        self, span: bytes, base: int, offsets: Sequence[int], lengths: Sequence[int]
    ) -> None:
        """Adds the serialized entries at `offsets` (of `lengths` bytes) in `span`, which was
        read from offset `base` of an entry log."""
        self._frame_span()
        if self.pieces:
            self.pieces.append(frame_records(span, base, offsets, lengths))
        else:
            self._span = (span, base, offsets, lengths)
        self.count += len(offsets)

    def parsed(self) -> list[pb.Entry]:
        """Returns the entries, parsed from their framing (for callers that want messages)."""
        self._frame_span()
        return list(pb.ReadRangeResponse.FromString(b"".join(self.pieces)).entries)

    def with_head(self, head: bytes) -> bytes:
        """Returns the answer: `head` (the response's other fields, serialized) and the
        entries."""
        if self._span is not None and not self.pieces:
            return frame_records(*self._span, head=head)
        self._frame_span()
        return b"".join([head, *self.pieces])
