"""The bookie's framing of ReadRange answers (stream/framing/range_answer.py): the compiled
`frame_records` (_native.c) against its Python definition over random spans, both refusing a
record outside the span, and a `FramedEntries` answer parsing as the response protobuf builds,
with and without the compiled module."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from stream.framing import native, range_answer
from stream.framing.encoding import varint
from stream.framing.range_answer import (
    ENTRIES_TAG,
    FramedEntries,
    frame_records,
    frame_records_python,
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


@pytest.mark.skipif(not native.BUILT, reason="the compiled module is not built")
@pytest.mark.parametrize("seed", range(5))
def test_the_compiled_framing_is_the_python_definition(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(100):
        span, base, offsets, lengths = _random_span(rng)
        expected = frame_records_python(span, base, offsets, lengths)
        assert native.frame_records(span, base, offsets, lengths, ENTRIES_TAG) == expected
        assert native.frame_records(memoryview(span), base, tuple(offsets), lengths, 0x12) == (
            expected
        )
        head = rng.randbytes(rng.choice([0, 1, 5, 30]))  # an answer's head, framed first
        assert frame_records_python(span, base, offsets, lengths, head) == head + expected
        assert native.frame_records(span, base, offsets, lengths, ENTRIES_TAG, head) == (
            head + expected
        )


@pytest.mark.parametrize("frame", [frame_records_python, frame_records])
def test_a_record_outside_the_span_is_refused(frame: Callable[..., bytes]) -> None:
    span = bytes(range(100))
    assert (
        frame(span, 50, [50, 60], [10, 40]) == b"\x12\x0a" + span[:10] + b"\x12\x28" + span[10:50]
    )
    for offsets, lengths in [
        ([49], [1]),  # before the span
        ([50, 60], [10, 91]),  # past its end
        ([140], [11]),
        ([60], [-1]),
        ([60, 70], [1]),  # the two columns differ in length
    ]:
        with pytest.raises(ValueError):
            frame(span, 50, offsets, lengths)
    with pytest.raises(ValueError):
        frame(span, -1, [0], [1])  # a span from before the log's start


@pytest.mark.skipif(not native.BUILT, reason="the compiled module is not built")
def test_the_compiled_framing_refuses_what_it_cannot_frame() -> None:
    with pytest.raises(ValueError):
        native.frame_records(b"abc", 0, [0], [1], 0x80)  # a tag of more than one byte
    with pytest.raises(TypeError):
        native.frame_records(b"abc", 0, [0], [1])
    with pytest.raises(TypeError):
        native.frame_records(b"abc", 0, 5, [1], ENTRIES_TAG)
    with pytest.raises(TypeError):
        native.frame_records(b"abc", 0, ["0"], [1], ENTRIES_TAG)
    with pytest.raises(TypeError):
        native.frame_records(b"abc", 0, [0], [1], ENTRIES_TAG, "a head of text")


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

    # An answer of one span (the usual one) is framed with its head in one step; the same
    # bytes with entries before or after it.
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
