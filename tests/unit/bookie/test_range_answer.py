"""The bookie's framing of ReadRange answers (stream/framing/range_answer.py): the compiled
`frame_spans` (_native.c) against its Python definition over random spans and single records
after a random head, both refusing a record outside its span, and a `FramedEntries` answer
being the bytes protobuf makes of the response, with and without the compiled module."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from stream.framing import native, range_answer
from stream.framing.encoding import varint
from stream.framing.range_answer import (
    ENTRIES_TAG,
    FramedEntries,
    Span,
    frame_spans,
    frame_spans_python,
)
from stream.wire import bookie_pb2 as pb

# Record lengths around each varint length the framing writes.
SIZES = [0, 1, 100, 127, 128, 1000, 16_383, 16_384, 70_000]


def _random_span(rng: random.Random) -> tuple[bytes, int, list[int], list[int]]:
    """A span read from offset `base` of a log, and records at offsets inside it, with gaps
    (record headers) of random size between them, or none."""
    base = rng.choice([0, 12, rng.getrandbits(40)])
    gap = rng.choice([0, 12, rng.randrange(40)])
    offsets, lengths = [], []
    position = base + rng.randrange(20)
    for _ in range(rng.choice([0, 1, 2, 7, 40])):
        length = rng.choice(SIZES + [rng.randrange(3000)] * 3)
        offsets.append(position)
        lengths.append(length)
        position += length + gap
    span = rng.randbytes(position - base + rng.randrange(20))
    return span, base, offsets, lengths


def _random_spans(rng: random.Random) -> list[Span]:
    """An answer's entries as they come: spans of entry logs and single records of the write
    caches (a span of one record at 0), in any mix, their columns lists or tuples."""
    spans: list[Span] = []
    for _ in range(rng.choice([0, 1, 2, 2, 3, 6])):
        if rng.random() < 0.3:
            record = rng.randbytes(rng.choice(SIZES + [rng.randrange(3000)]))
            spans.append((record, 0, (0,), (len(record),)))
        else:
            span, base, offsets, lengths = _random_span(rng)
            spans.append((span, base, tuple(offsets), lengths))
    return spans


def _framed(spans: list[Span], head: bytes) -> bytes:
    """What `frame_spans` returns, written out record by record."""
    return head + b"".join(
        b"\x12" + varint(n) + bytes(span[o - base : o - base + n])
        for span, base, offsets, lengths in spans
        for o, n in zip(offsets, lengths, strict=True)
    )


@pytest.mark.skipif(not native.BUILT, reason="the compiled module is not built")
@pytest.mark.parametrize("seed", range(5))
def test_the_compiled_framing_is_the_python_definition(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(100):
        spans = _random_spans(rng)
        head = rng.randbytes(rng.choice([0, 1, 5, 30]))  # an answer's head, framed first
        expected = frame_spans_python(spans, head)
        assert expected == _framed(spans, head)
        assert native.frame_spans(spans, ENTRIES_TAG, head) == expected
        # Any buffers, and the spans in a tuple.
        views = tuple((memoryview(s), b, o, n) for s, b, o, n in spans)
        assert native.frame_spans(views, 0x12, bytearray(head)) == expected
        assert frame_spans_python(views, head) == expected


@pytest.mark.parametrize("frame", [frame_spans_python, frame_spans])
def test_a_record_outside_its_span_is_refused(frame: Callable[..., bytes]) -> None:
    span = bytes(range(100))
    record = b"a record"
    whole = (record, 0, (0,), (len(record),))
    assert frame([(span, 50, [50, 60], [10, 40]), whole], b"H") == (
        b"H\x12\x0a" + span[:10] + b"\x12\x28" + span[10:50] + b"\x12\x08" + record
    )
    assert frame([]) == b""
    for offsets, lengths in [
        ([49], [1]),  # before the span
        ([50, 60], [10, 91]),  # past its end
        ([140], [11]),
        ([60], [-1]),
        ([60, 70], [1]),  # the two columns differ in length
    ]:
        with pytest.raises(ValueError):
            frame([(span, 50, offsets, lengths)])
        with pytest.raises(ValueError):  # in a span after good ones
            frame([whole, (span, 50, [50], [50]), (span, 50, offsets, lengths)], b"H")
    with pytest.raises(ValueError):
        frame([whole, (span, -1, [0], [1])])  # a span from before the log's start
    with pytest.raises(ValueError):
        frame([(record, 0, (0,), (len(record) + 1,))])  # a record longer than it is


@pytest.mark.skipif(not native.BUILT, reason="the compiled module is not built")
def test_the_compiled_framing_refuses_what_it_cannot_frame() -> None:
    good = (b"abc", 0, [0], [1])
    with pytest.raises(ValueError):
        native.frame_spans([good], 0x80, b"")  # a tag of more than one byte
    with pytest.raises(TypeError):
        native.frame_spans([good], ENTRIES_TAG)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        native.frame_spans(good, ENTRIES_TAG, b"")  # type: ignore[arg-type]  # not in a sequence
    with pytest.raises(TypeError):
        native.frame_spans([[b"abc", 0, [0], [1]]], ENTRIES_TAG, b"")  # type: ignore[list-item]
    with pytest.raises(TypeError):
        native.frame_spans([(b"abc", 0, [0])], ENTRIES_TAG, b"")  # type: ignore[list-item]
    with pytest.raises(TypeError):
        native.frame_spans([(b"abc", 0, 5, [1])], ENTRIES_TAG, b"")  # type: ignore[list-item]
    with pytest.raises(TypeError):
        native.frame_spans([(b"abc", 0, ["0"], [1])], ENTRIES_TAG, b"")  # type: ignore[list-item]
    with pytest.raises(TypeError):
        native.frame_spans([("abc", 0, [0], [1])], ENTRIES_TAG, b"")  # type: ignore[list-item]
    with pytest.raises(TypeError):
        native.frame_spans([good], ENTRIES_TAG, "a head of text")  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        native.frame_spans([(b"abc", 0, [1 << 64], [1])], ENTRIES_TAG, b"")
    # A refused call lets go of the spans it held: a bytearray can be resized again.
    held = bytearray(b"abcdef")
    with pytest.raises(ValueError):
        native.frame_spans([(held, 0, [0], [1]), (b"abc", 0, [0], [9])], ENTRIES_TAG, b"")
    assert native.frame_spans([(held, 0, [0], [1])], ENTRIES_TAG, b"") == b"\x12\x01a"
    held += b"resized"


@pytest.mark.parametrize("compiled", [True, False])
def test_two_spans_and_a_record_are_the_response_protobuf_serializes(
    compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer read as two spans (two entry logs, or two preads of one) with a cached record
    between them is, byte for byte, what protobuf makes of the response with those entries."""
    if compiled and not native.BUILT:
        pytest.skip("the compiled module is not built")
    monkeypatch.setattr(native, "BUILT", compiled)
    entries = [
        pb.Entry(entry_id=i, timestamp_ms=1_700_000_000_000 + i, payload=b"p" * n, crc32c=i + 7)
        for i, n in enumerate(SIZES * 2 + [1024] * 50)
    ]
    records = [e.SerializeToString() for e in entries]
    header = b"h" * 12  # an entry-log record's header, between the records of a span

    def span_of(part: list[bytes], base: int) -> tuple[bytes, int, list[int], list[int]]:
        offsets, position = [], base + len(header)
        for record in part:
            offsets.append(position)
            position += len(record) + len(header)
        return b"".join(header + r for r in part), base, offsets, list(map(len, part))

    cut = len(SIZES)
    framed = FramedEntries()
    framed.add_span(*span_of(records[:cut], 4096))
    framed.append(records[cut])  # from a write cache
    framed.add_span(*span_of(records[cut + 1 :], 1 << 33))
    assert len(framed) == len(entries)

    # The head's fields come before `entries` (field 2) in protobuf's order: the same bytes.
    head = pb.ReadRangeResponse(code=pb.NO_SUCH_ENTRY)
    assert framed.with_head(head.SerializeToString()) == (
        pb.ReadRangeResponse(code=pb.NO_SUCH_ENTRY, entries=entries).SerializeToString()
    )
    # `lac` (field 3) is serialized after `entries` by protobuf, before them by the bookie:
    # the answer is protobuf's head and protobuf's entries, end to end, which parse as one.
    head = pb.ReadRangeResponse(code=pb.OK, lac=123_456_789, first_entry_id=5)
    answer = framed.with_head(head.SerializeToString())
    assert (
        answer
        == head.SerializeToString() + pb.ReadRangeResponse(entries=entries).SerializeToString()
    )
    assert pb.ReadRangeResponse.FromString(answer) == pb.ReadRangeResponse(
        code=pb.OK, lac=123_456_789, first_entry_id=5, entries=entries
    )
    assert framed.parsed() == entries
    assert framed.with_head(b"") == pb.ReadRangeResponse(entries=entries).SerializeToString()


@pytest.mark.parametrize("compiled", [True, False])
def test_a_framed_answer_parses_as_the_answer(
    compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries from the write cache (one record each) and from an entry log's span (records
    between headers), framed after the head's fields, parse as the response with those entries:
    across varint length boundaries and after the cache of frames was emptied."""
    if compiled and not native.BUILT:
        pytest.skip("the compiled module is not built")
    monkeypatch.setattr(native, "BUILT", compiled)
    entries = [
        pb.Entry(entry_id=i, timestamp_ms=1_700_000_000_000, payload=b"p" * n, crc32c=i + 1)
        for i, n in enumerate(SIZES + SIZES)
    ]
    records = [e.SerializeToString() for e in entries]
    header = b"h" * 12
    span = header.join(records[len(SIZES) :])
    offsets, lengths, position = [], [], 1000
    for record in records[len(SIZES) :]:
        offsets.append(position)
        lengths.append(len(record))
        position += len(record) + len(header)

    head = pb.ReadRangeResponse(code=pb.OK, lac=41)
    framed = FramedEntries()
    for record in records[: len(SIZES)]:
        framed.append(record)
    framed.add_span(span, 1000, offsets, lengths)
    assert len(framed) == len(entries)
    answer = framed.with_head(head.SerializeToString())
    assert answer == head.SerializeToString() + b"".join(
        b"\x12" + varint(len(r)) + r for r in records
    )
    assert pb.ReadRangeResponse.FromString(answer) == pb.ReadRangeResponse(
        code=pb.OK, lac=41, entries=entries
    )

    # An answer of one span (the usual one), of spans and records in any order, of two spans:
    # each framed with its head in one step, the same bytes as framed piece by piece.
    only_span = FramedEntries()
    only_span.add_span(span, 1000, offsets, lengths)
    expected_span = b"".join(b"\x12" + varint(len(r)) + r for r in records[len(SIZES) :])
    assert only_span.with_head(b"HEAD") == b"HEAD" + expected_span
    assert [e.entry_id for e in only_span.parsed()] == [e.entry_id for e in entries[len(SIZES) :]]
    span_then_record = FramedEntries()
    span_then_record.add_span(span, 1000, offsets, lengths)
    span_then_record.append(records[0])
    span_then_record.add_span(span, 1000, offsets[:1], lengths[:1])
    assert span_then_record.with_head(b"HEAD") == (
        b"HEAD"
        + expected_span
        + b"\x12"
        + varint(len(records[0]))
        + records[0]
        + expected_span[: 1 + len(varint(lengths[0])) + lengths[0]]
    )
    assert len(span_then_record) == len(offsets) + 2
    two_spans = FramedEntries()  # an answer read from two entry logs
    two_spans.add_span(span, 1000, offsets[:1], lengths[:1])
    two_spans.add_span(span, 1000, offsets[1:], lengths[1:])
    assert two_spans.with_head(b"HEAD") == b"HEAD" + expected_span

    many = FramedEntries()
    for n in range(5000):  # more lengths than the cache of frames keeps
        many.append(b"x" * n)
    assert len(range_answer._FRAMES) <= 4096
    again = FramedEntries()
    for record in records:
        again.append(record)
    assert again.with_head(head.SerializeToString()) == answer
