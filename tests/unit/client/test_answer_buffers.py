"""The buffers a reader receives range answers and builds payload columns in
(stream.client.answer_buffers): the compiled resize held to its Python definition, large
buffers handed out again only once nobody holds them (a reference or a view), and the data
port's connection and the walker using them without an answer or a column changing under
whoever still holds it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from stream.client import answer_buffers
from stream.client.answer_buffers import AnswerBuffers, sized_buffer_python
from stream.client.data_port_reads import _Connection
from stream.client.range_answer import range_answer
from stream.framing import native
from stream.framing.prepare import prepare_entry
from stream.wire import bookie_pb2 as pb
from stream.wire import frames

MIB = 1 << 20
Sized = Callable[[bytearray | None, int], bytearray]


@pytest.mark.parametrize("sized", [native.sized_buffer, sized_buffer_python])
def test_a_resize_keeps_the_first_bytes_and_refuses_what_it_cannot_do(sized: Sized) -> None:
    rng = random.Random(3)
    buffer = sized(None, 100)
    assert type(buffer) is bytearray and len(buffer) == 100
    for _ in range(300):
        pattern = rng.randbytes(len(buffer))
        buffer[:] = pattern
        size = rng.choice([0, 1, rng.randrange(200), rng.randrange(5000), len(buffer)])
        assert sized(buffer, size) is buffer
        assert len(buffer) == size
        kept = min(size, len(pattern))
        assert buffer[:kept] == pattern[:kept]
    view = memoryview(buffer)
    with pytest.raises(BufferError):
        sized(buffer, len(buffer) + 1)
    view.release()
    with pytest.raises(ValueError):
        sized(None, -1)


def test_the_compiled_resize_stays_within_the_allocation() -> None:
    # Below half of the allocation too: PyByteArray_Resize would reallocate it smaller, and a
    # kept buffer would lose its room.
    buffer = native.sized_buffer(None, 10 * MIB)
    allocation = buffer.__alloc__()
    for size in (0, 1, MIB, 10 * MIB - 1, 3):
        native.sized_buffer(buffer, size)
        assert len(buffer) == size and buffer.__alloc__() == allocation
    native.sized_buffer(buffer, 11 * MIB)
    assert len(buffer) == 11 * MIB
    with pytest.raises(TypeError):
        native.sized_buffer(b"bytes", 1)  # type: ignore[arg-type]


def test_large_buffers_are_handed_out_again_only_once_nobody_holds_them() -> None:
    buffers = AnswerBuffers()
    first = buffers.take(8 * MIB)
    first[:] = b"a" * len(first)
    second = buffers.take(8 * MIB)
    assert second is not first  # the first is held
    second_id = id(second)
    del second
    third = buffers.take(8 * MIB - 100)
    assert id(third) == second_id and len(third) == 8 * MIB - 100
    assert first == b"a" * (8 * MIB)
    # A view holds it too (the Spark reader's Arrow buffers are views of the columns).
    view = memoryview(third)
    third_id = id(third)
    del third
    fourth = buffers.take(8 * MIB)
    assert id(fourth) != third_id
    view.release()
    # At most two kept: the rest are new each time.
    assert len(buffers._kept) == 2
    # Small ones are never kept, and a kept one whose allocation is more than twice what is
    # asked is not cut down to it (it would be reallocated smaller).
    assert buffers.take(MIB) not in buffers._kept
    del first, fourth
    kept = [id(b) for b in buffers._kept]
    small = buffers.take(3 * MIB)
    assert id(small) not in kept


def _answer_frame(body: bytes) -> bytes:
    return frames.length_prefix(len(body) + 1) + frames.ANSWER + body


class _Transport:
    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _receive(connection: _Connection, data: bytes) -> None:
    """Feeds `data` to `connection` as the event loop would, in pieces of up to 64 KiB."""
    at = 0
    while at < len(data):
        target = connection.get_buffer(65536)
        count = min(len(target), len(data) - at, 65536)
        target[:count] = data[at : at + count]
        connection.buffer_updated(count)
        at += count


def test_a_received_answer_does_not_change_while_it_is_held() -> None:
    async def main() -> None:
        buffers = AnswerBuffers()
        connection = _Connection("bookie-1", buffers)
        connection.transport = _Transport()  # type: ignore[assignment]
        bodies = [bytes([65 + i]) * (3 * MIB) for i in range(4)]
        _receive(connection, _answer_frame(bodies[0]))
        _, held = connection._frames.popleft()
        _receive(connection, _answer_frame(bodies[1]))
        _, dropped = connection._frames.popleft()
        dropped_id = id(dropped)
        del dropped
        for body in bodies[2:]:
            _receive(connection, _answer_frame(body))
            _, got = connection._frames.popleft()
            assert got == body
            # Received into again (a kept buffer), the held one left alone.
            assert id(got) == dropped_id and any(got is kept for kept in buffers._kept)
            del got
        assert held == bodies[0]

    asyncio.run(main())


def _serialized_answer(stream_id: int, first: int, count: int, fill: int) -> bytes:
    entries = [
        prepare_entry(stream_id, first + i, 0, 1_700_000_000_000, bytes([fill]) * 1024).entry()
        for i in range(count)
    ]
    return pb.ReadRangeResponse(code=pb.OK, entries=entries).SerializeToString()


def test_a_walked_answers_payloads_do_not_change_while_they_are_held() -> None:
    buffers = AnswerBuffers()
    answers = [_serialized_answer(5, 2_500 * k, 2_500, 97 + k) for k in range(3)]
    held = range_answer(5, 0, answers[0], buffers)
    for k in (1, 2):
        walked = range_answer(5, 2_500 * k, answers[k], buffers)
        plain = range_answer(5, 2_500 * k, answers[k])
        assert walked.accepted == plain.accepted == 2_500
        assert walked.columns.payloads == plain.columns.payloads
    assert held.columns.payloads == [b"a" * 1024] * 2_500
    assert len(answers[0]) > answer_buffers._KEPT_FROM_BYTES
