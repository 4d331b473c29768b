"""The replication worker's copy sink: how a target's answers to the copied adds end up."""

from __future__ import annotations

import asyncio

import pytest

from stream.autorecovery.worker import ReplicationFailed, _CopySink
from stream.client.ports import AddBatch
from stream.clock import SystemClock
from stream.metadata import StreamMeta
from stream.wire import bookie_pb2 as pb


class _AnsweringStream:
    """An `AddStream` port whose every batch gets one fixed answer."""

    def __init__(self, answer: pb.AddResponse) -> None:
        self._answer = answer

    def send(self, batch: AddBatch) -> asyncio.Future[pb.AddResponse]:
        future: asyncio.Future[pb.AddResponse] = asyncio.get_running_loop().create_future()
        future.set_result(self._answer)
        return future

    def close(self) -> None:
        pass


def _sink(answer: pb.AddResponse) -> _CopySink:
    """A copy sink whose target answers every batch with `answer`."""
    return _CopySink(
        _AnsweringStream(answer),
        StreamMeta("s", 1, 3, 3, 2, 10, 1000, term=3),
        timeout_s=5.0,
        rate_bytes=0,
        clock=SystemClock(),
    )


def test_a_refused_copy_fails_with_the_bookies_codes_term_and_message() -> None:
    refusal = pb.AddResponse(codes=[pb.INVALID_TERM], bookie_term=7, message="fenced at term 7")
    sink = _sink(refusal)

    async def copy_one() -> None:
        await sink.send([pb.Entry(entry_id=0, payload=b"x")])
        await sink.drain()

    with pytest.raises(ReplicationFailed) as raised:
        asyncio.run(copy_one())
    assert raised.value.context == {
        "codes": ["INVALID_TERM"],
        "bookie_term": 7,
        "bookie_message": "fenced at term 7",
    }


@pytest.mark.parametrize(
    "answer",
    [
        pb.AddResponse(entry_ids=[0, 1], codes=[pb.OK, pb.OK]),
        # A data port of version 2 names the ids as a range, with one code for all.
        pb.AddResponse(first_entry_id=0, entry_count=2, codes=[pb.OK]),
    ],
)
def test_a_copy_answered_ok_in_either_form_is_settled(answer: pb.AddResponse) -> None:
    sink = _sink(answer)

    async def copy_two() -> None:
        await sink.send([pb.Entry(entry_id=i, payload=b"x") for i in range(2)])
        await sink.drain()

    asyncio.run(copy_two())
