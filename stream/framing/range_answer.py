"""A bookie's ReadRange answer, framed by hand from the entries as the entry logs and write
caches store them (serialized): no entry is parsed and built again, and the answer's head and
all its entries (runs of records read from an entry log with one pread each, and cached
records) are framed in one compiled step (`frame_spans`, _native.c), into one bytes object
without a bytes object per entry. `frame_spans_python` is the definition the compiled step is
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


# A span of an entry log: its bytes, the log offset they were read from, and its records' log
# offsets and lengths. A record by itself (from a write cache) is the span (record, 0, (0,),
# (len(record),)).
Span = tuple[bytes | bytearray | memoryview, int, Sequence[int], Sequence[int]]
_AT_START = (0,)  # a cached record's offset column, one tuple for all of them


def frame_spans_python(spans: Sequence[Span], head: bytes = b"") -> bytes:
    """Returns `head`, then each record span[offset - base : offset - base + length] of each
    (span, base, offsets, lengths) of `spans` in turn framed as one of `entries`, as one bytes
    object; a record outside its span raises ValueError."""
    parts: list[bytes | bytearray | memoryview] = [head]
    for k, (span, base, offsets, lengths) in enumerate(spans):
        if len(offsets) != len(lengths):
            raise ValueError("offsets and lengths differ in length")
        if base < 0:
            raise ValueError("base must not be negative")
        starts = list(map(sub, offsets, repeat(base)))
        for i, (start, length) in enumerate(zip(starts, lengths, strict=True)):
            if start < 0 or length < 0 or start + length > len(span):
                raise ValueError(
                    f"record {i} of span {k} (offset {start + base}, length {length}) is "
                    f"outside the span (base {base}, {len(span)} bytes)"
                )
        for start, length in zip(starts, lengths, strict=True):
            parts += (_FRAMES[length], span[start : start + length])
    return b"".join(parts)


def frame_spans(spans: Sequence[Span], head: bytes = b"") -> bytes:
    """`frame_spans_python`, compiled where the module is built."""
    if native.BUILT:
        return native.frame_spans(spans, ENTRIES_TAG, head)
    return frame_spans_python(spans, head)


class FramedEntries:
    """One answer's entries, to be framed as ReadRangeResponse.entries after the answer's head
    (`with_head`), and how many entries they hold. The spans and records are kept as they came
    and framed with the head in one compiled step, in one allocation: each record is copied
    once, whether the answer is one span, two (its index locations are fetched 4,096 at a
    time, so an 8 MiB answer is usually two preads), or holds cached records."""

    __slots__ = ("count", "_spans")

    def __init__(self) -> None:
        self.count = 0
        self._spans: list[Span] = []

    def __len__(self) -> int:
        return self.count

    def append(self, record: bytes) -> None:
        """Adds one serialized entry."""
        self._spans.append((record, 0, _AT_START, (len(record),)))
        self.count += 1

    def add_span(
        self, span: bytes, base: int, offsets: Sequence[int], lengths: Sequence[int]
    ) -> None:
        """Adds the serialized entries at `offsets` (of `lengths` bytes) in `span`, which was
        read from offset `base` of an entry log."""
        self._spans.append((span, base, offsets, lengths))
        self.count += len(offsets)

    def parsed(self) -> list[pb.Entry]:
        """Returns the entries, parsed from their framing (for callers that want messages)."""
        return list(pb.ReadRangeResponse.FromString(frame_spans(self._spans)).entries)

    def with_head(self, head: bytes) -> bytes:
        """Returns the answer: `head` (the response's other fields, serialized) and the
        entries."""
        return frame_spans(self._spans, head)
