"""The timestamp a takeover's new term starts from (`Takeover._timestamp_before`): the last
entry before the recovered range, read from its write set. When no holder answers with it (one
cut off, one in limbo after a disk wipe: the simulator's seed 8640) the attempt is retried
rather than stamped by the new writer's clock, which may be behind the previous writer's and
turn the stream's time back. Only an accept-loss recovery goes on without it."""

from __future__ import annotations

import asyncio
import random

import pytest

from stream.client.options import WriterOptions
from stream.client.recovery import Takeover, WriterIdentity
from stream.client.takeover_signals import RetryLater
from stream.metadata.model import Fragment, StreamMeta
from stream.protocol.checksum import entry_checksum
from stream.wire import bookie_pb2 as pb

STREAM_ID = 9
ENTRY = 5
PREVIOUS_WRITER_TS = 1_700_000_072_873
OPTIONS = WriterOptions(retry_backoff_s=0.001, recovery_read_timeout_s=1.0)
META = StreamMeta("s", STREAM_ID, 3, 2, 2, 8, 1 << 20, term=2)
LAST = Fragment(0, ("b1", "b3", "b5"))


class _Bookies:
    """Bookies answering reads of entry 5: `holding` with it, the others UNKNOWN (in limbo or
    cut off: an answer that proves nothing)."""

    def __init__(self, holding: frozenset[str] = frozenset()) -> None:
        self.holding = holding
        self.reads = 0

    async def read(
        self, bookie_id: str, stream_id: int, entry_id: int, *, term: int = 0, timeout_s: float
    ) -> pb.ReadResponse:
        self.reads += 1
        if bookie_id not in self.holding:
            return pb.ReadResponse(code=pb.UNKNOWN)
        crc = entry_checksum(stream_id, entry_id, 0, PREVIOUS_WRITER_TS, b"x")
        entry = pb.Entry(
            entry_id=entry_id, timestamp_ms=PREVIOUS_WRITER_TS, payload=b"x", crc32c=crc
        )
        return pb.ReadResponse(code=pb.OK, entry=entry)


class _Clock:
    def now_ms(self) -> int:
        return 1_700_000_019_060  # behind the previous writer's


def _takeover(bookies: _Bookies, accept_loss_operator: str | None = None) -> Takeover:
    return Takeover(
        "s",
        transport=bookies,  # type: ignore[arg-type]
        metadata=None,  # type: ignore[arg-type]  # not read: the entry is in the last fragment
        clock=_Clock(),
        rng=random.Random(0),
        options=OPTIONS,
        identity=WriterIdentity("w"),
        accept_loss_operator=accept_loss_operator,
    )


def test_the_floor_is_the_last_entrys_timestamp() -> None:
    bookies = _Bookies(frozenset({"b1"}))  # entry 5 is on b5 and b1
    floor = asyncio.run(_takeover(bookies)._timestamp_before(META, LAST, ENTRY))
    assert floor == PREVIOUS_WRITER_TS


def test_an_unreadable_floor_retries_the_attempt_instead_of_using_the_clock() -> None:
    bookies = _Bookies()
    with pytest.raises(RetryLater) as raised:
        asyncio.run(_takeover(bookies)._timestamp_before(META, LAST, ENTRY))
    assert f"timestamp of entry {ENTRY}" in str(raised.value.error)
    assert bookies.reads > 2  # every round over the write set first


def test_an_accept_loss_recovery_goes_on_without_it() -> None:
    takeover = _takeover(_Bookies(), accept_loss_operator="ops")
    assert asyncio.run(takeover._timestamp_before(META, LAST, ENTRY)) is None


def test_a_stream_without_entries_has_no_floor() -> None:
    bookies = _Bookies()
    assert asyncio.run(_takeover(bookies)._timestamp_before(META, LAST, -1)) is None
    assert bookies.reads == 0
