"""The reader's side of range reads over a data port (stream.client.data_port_reads) against a
scripted bookie on loopback: answers whole and in order however the socket cuts them, one
connection reused range after range, an abandoned range's connection closed, a bookie that
refuses the reads' preamble (older) read over gRPC from then on, a refusal of another kind
left to gRPC's answer, a silent bookie timed out, a reader that takes nothing stopping
the bookie's sends, and ReadLac requests on the same connections."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import Awaitable, Callable

import pytest

from stream.client.data_port_reads import DataPortReads, RangeAnswers
from stream.errors import BookieError
from stream.wire import bookie_pb2 as pb
from stream.wire import frames

from ..polling import holds_for, until
from .test_data_port_stream import Bookie, connect, read_hello, refusal

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
END = frames.length_prefix(1) + frames.END


def answer(code: int, payload_bytes: int = 0) -> bytes:
    """A ReadRange answer frame: `code`, and one entry of `payload_bytes` when not zero."""
    response = pb.ReadRangeResponse(code=code, lac=7)
    if payload_bytes:
        response.entries.append(pb.Entry(entry_id=1, payload=b"p" * payload_bytes))
    body = frames.ANSWER + response.SerializeToString()
    return frames.length_prefix(len(body)) + body


def request(first: int, last: int) -> bytes:
    return pb.ReadRangeRequest(
        stream_id=3, first_entry_id=first, last_entry_id=last
    ).SerializeToString()


async def read_request(reader: asyncio.StreamReader) -> pb.ReadRangeRequest:
    body = await read_frame(reader)
    assert body[:1] == frames.READ_RANGE  # version 2: each request starts with its kind
    return pb.ReadRangeRequest.FromString(body[1:])


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = frames.LENGTH.unpack(await reader.readexactly(4))
    return await reader.readexactly(size)


def reads_of(addresses: list[str | None], resolved: list[bool] | None = None) -> DataPortReads:
    """Range reads of bookie-1, whose registration reads `addresses` in turn (the last stays)."""

    async def resolve(bookie_id: str, fresh: bool) -> str | None:
        assert bookie_id == "bookie-1"
        if resolved is not None:
            resolved.append(fresh)
        return addresses.pop(0) if len(addresses) > 1 else addresses[0]

    return DataPortReads(
        resolve, connect, lambda reason, bookie: BookieError(reason, bookie=bookie)
    )  # type: ignore[arg-type]


async def collect(answers: RangeAnswers | None) -> list[pb.ReadRangeResponse]:
    assert answers is not None
    return [pb.ReadRangeResponse.FromString(bytes(a)) async for a in answers]


def test_answers_arrive_whole_however_the_socket_cuts_them_and_one_connection_serves_on() -> None:
    connections = []
    frames_sent = [answer(pb.OK, 300_000), answer(pb.OK, 5), answer(pb.NO_SUCH_ENTRY), END]
    stream = b"".join(frames_sent)
    starts = [sum(map(len, frames_sent[:i])) for i in range(len(frames_sent))]
    rng = random.Random(5)

    def cuts(seed: int) -> list[int]:
        """Where the bytes are cut: inside every frame's header (each of its five bytes
        alone, for seed 0), a byte before each frame's end, and at random."""
        inside_headers = {start + k for start in starts for k in range(1, 6) if k % 3 != seed}
        before_ends = {start - 1 for start in [*starts[1:], len(stream)]}
        random_cuts = rng.sample(range(1, len(stream)), 20)
        return sorted({*inside_headers, *before_ends, *random_cuts, len(stream)})

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(await read_hello(reader, frames.READ_PREAMBLE))
        for seed in range(3):  # each range's answers sent in pieces cut differently
            got = await read_request(reader)
            assert got.first_entry_id == seed
            at = 0
            for cut in cuts(seed):
                writer.write(stream[at:cut])
                await writer.drain()
                await asyncio.sleep(0.002)  # so that the reader receives each piece alone
                at = cut
        await reader.read()

    async def main() -> None:
        async with Bookie(script) as address:
            reads = reads_of([address])
            for seed in range(3):
                got = await collect(await reads.read_range("bookie-1", request(seed, 10), 30))
                assert [(r.code, len(r.entries)) for r in got] == [
                    (pb.OK, 1),
                    (pb.OK, 1),
                    (pb.NO_SUCH_ENTRY, 0),
                ]
                assert len(got[0].entries[0].payload) == 300_000
            reads.close()
        assert connections == ["bookie-1"]  # one connection, three ranges

    asyncio.run(main())


def test_an_abandoned_range_closes_its_connection() -> None:
    hellos: list[str] = []
    closed: asyncio.Event | None = None

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hellos.append(await read_hello(reader, frames.READ_PREAMBLE))
        await read_request(reader)
        writer.write(answer(pb.OK, 10) + answer(pb.OK, 10))  # and more to come, never sent
        await writer.drain()
        # The reader hangs up (a reset: it leaves answers unread), with nothing more sent.
        with contextlib.suppress(ConnectionResetError):
            assert await reader.read() == b""
        assert closed is not None
        closed.set()

    async def main() -> None:
        nonlocal closed
        closed = asyncio.Event()
        async with Bookie(script) as address:
            reads = reads_of([address])
            answers = await reads.read_range("bookie-1", request(0, 100), 30)
            assert answers is not None
            async for _ in answers:
                break
            connection = answers._connection
            assert connection is not None
            await until(lambda: connection._frames)  # the second answer arrives, not taken
            await answers.aclose()
            await asyncio.wait_for(closed.wait(), 10)
            # The next range opens a new connection.
            closed.clear()
            later = await reads.read_range("bookie-1", request(0, 1), 10)
            assert later is not None
            await later.aclose()
            await asyncio.wait_for(closed.wait(), 10)
            reads.close()
        assert len(hellos) == 2

    asyncio.run(main())


def test_a_bookie_that_refuses_the_preamble_is_read_over_grpc_from_then_on() -> None:
    async def older(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(len(frames.READ_PREAMBLE))
        writer.write(refusal("not a data port client: expected one of [b'SKADD/1\\n']"))
        writer.close()

    async def strict(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_hello(reader, frames.READ_PREAMBLE)
        writer.write(refusal("ReadRange refused: principal 'x' (no role) is not allowed it"))
        writer.close()

    async def main() -> None:
        async with Bookie(older) as address:
            resolved: list[bool] = []
            reads = reads_of([address], resolved)
            assert await reads.read_range("bookie-1", request(0, 1), 10) is None
            assert await reads.read_range("bookie-1", request(0, 1), 10) is None
            assert resolved == [False]  # the second read did not even look for the port
        async with Bookie(strict) as address:
            resolved = []
            reads = reads_of([address], resolved)
            # gRPC gives this read's answer (there, the reason); the next one tries again.
            assert await reads.read_range("bookie-1", request(0, 1), 10) is None
            assert await reads.read_range("bookie-1", request(0, 1), 10) is None
            assert resolved == [False, False]
        # No data port: gRPC.
        assert await reads_of([None]).read_range("bookie-1", request(0, 1), 10) is None

    asyncio.run(main())


def test_a_silent_bookie_times_out_and_a_lost_idle_connection_is_replaced() -> None:
    served = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_hello(reader, frames.READ_PREAMBLE)
        served.append(await read_request(reader))
        if len(served) == 1:
            writer.write(answer(pb.OK, 3) + END)  # then hang up: the connection is idle
            await writer.drain()
            writer.close()
            return
        if len(served) == 2:
            await reader.read()  # never answers
            return
        writer.write(answer(pb.NO_SUCH_ENTRY) + END)
        await reader.read()

    async def main() -> None:
        async with Bookie(script) as address:
            reads = reads_of([address])
            assert len(await collect(await reads.read_range("bookie-1", request(0, 0), 10))) == 1
            await until(lambda: not reads._idle["bookie-1"][0].usable)  # the bookie's close
            with pytest.raises(BookieError, match="timed out"):
                await reads.read_range("bookie-1", request(1, 1), 0.5)
            got = await collect(await reads.read_range("bookie-1", request(2, 2), 10))
            assert [r.code for r in got] == [pb.NO_SUCH_ENTRY]
            reads.close()
        assert [r.first_entry_id for r in served] == [0, 1, 2]

    asyncio.run(main())


def test_a_reader_that_takes_nothing_stops_receiving() -> None:
    """Received answers not taken stop the connection's reads (then the bookie's sends, by
    TCP's window): the bookie here cannot send all it has."""
    sent = []
    one = answer(pb.OK, 1 << 20)

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_hello(reader, frames.READ_PREAMBLE)
        await read_request(reader)
        with contextlib.suppress(ConnectionError):
            for _ in range(64):
                writer.write(one)
                await writer.drain()
                sent.append(1)
            writer.write(END)
            await writer.drain()

    async def main() -> None:
        async with Bookie(script) as address:
            reads = reads_of([address])
            answers = await reads.read_range("bookie-1", request(0, 10**6), 30)
            assert answers is not None
            # Two answers queued, and what the sockets hold: far from the 64 MiB on offer.
            assert await holds_for(1.0, lambda: len(sent) < 32)
            taken = [a async for a in answers]
            assert len(taken) == 64 and len(sent) == 64
            reads.close()

    asyncio.run(main())


def test_a_read_connection_keeps_tcp_keepalive_for_a_dead_host() -> None:
    """An idle connection to a bookie whose host died is noticed (as gRPC's channel pings),
    not found out by the next range's timeout."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_hello(reader, frames.READ_PREAMBLE)
        await read_request(reader)
        writer.write(answer(pb.OK, 3) + END)
        await reader.read()

    async def main() -> None:
        async with Bookie(script) as address:
            reads = reads_of([address])
            await collect(await reads.read_range("bookie-1", request(0, 0), 10))
            [connection] = reads._idle["bookie-1"]
            assert connection.transport is not None
            sock = connection.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            options = (socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT)
            assert [sock.getsockopt(socket.IPPROTO_TCP, o) for o in options] == [10, 5, 1]
            reads.close()

    asyncio.run(main())


def test_a_read_cancelled_before_its_first_answer_closes_its_connection() -> None:
    hung_up = []
    asked = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_hello(reader, frames.READ_PREAMBLE)
        asked.append(await read_request(reader))
        hung_up.append(await reader.read() == b"")  # never answers; the reader hangs up

    async def main() -> None:
        async with Bookie(script) as address:
            reads = reads_of([address])
            task = asyncio.ensure_future(reads.read_range("bookie-1", request(0, 0), 30))
            await until(lambda: asked)  # the bookie has the request
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await until(lambda: hung_up)
            assert hung_up == [True] and not reads._open
            reads.close()

    asyncio.run(main())


def test_a_range_left_at_its_last_answer_keeps_its_connection() -> None:
    """A reader stops at an answer whose code ends the range (as the reader does at
    NO_SUCH_ENTRY): with only the END frame left, the connection serves the next range."""
    hellos = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hellos.append(await read_hello(reader, frames.READ_PREAMBLE))
        for _ in range(2):
            await read_request(reader)
            writer.write(answer(pb.OK, 3) + answer(pb.NO_SUCH_ENTRY) + END)
        await reader.read()

    async def main() -> None:
        async with Bookie(script) as address:
            reads = reads_of([address])
            for _ in range(2):
                answers = await reads.read_range("bookie-1", request(0, 9), 10)
                assert answers is not None
                async for body in answers:
                    if pb.ReadRangeResponse.FromString(bytes(body)).code != pb.OK:
                        break
                connection = answers._connection
                assert connection is not None
                await until(lambda c=connection: c._frames)  # the END frame arrives
                await answers.aclose()
            reads.close()
        assert hellos == ["bookie-1"]

    asyncio.run(main())


def test_read_lac_shares_the_range_connections_and_an_older_bookie_is_read_over_grpc() -> None:
    """A ReadLac goes over the same connections as the ranges (its kind first), answered by
    one frame and END; a bookie that refuses the preamble leaves it to gRPC, as a range."""
    hellos = []
    asked: list[pb.ReadLacRequest] = []
    lac_answer = pb.ReadLacResponse(code=pb.OK, lac=41, lafr=40).SerializeToString()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hellos.append(await read_hello(reader, frames.READ_PREAMBLE))
        body = await read_frame(reader)
        assert body[:1] == frames.READ_LAC
        asked.append(pb.ReadLacRequest.FromString(body[1:]))
        writer.write(frames.frame(frames.ANSWER + lac_answer) + END)
        await read_request(reader)  # then a range, on the same connection
        writer.write(answer(pb.NO_SUCH_ENTRY) + END)
        body = await read_frame(reader)
        assert body[:1] == frames.READ_LAC
        writer.write(frames.frame(frames.ANSWER + lac_answer) + answer(pb.OK) + END)
        await reader.read()

    async def older(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(len(frames.READ_PREAMBLE))
        writer.write(refusal("not a data port client: expected one of [b'SKRNG/1\\n']"))
        writer.close()

    lac_request = pb.ReadLacRequest(stream_id=3, known_lac=-1, timeout_ms=0).SerializeToString()

    async def main() -> None:
        async with Bookie(script) as address:
            reads = reads_of([address])
            got = await reads.read_lac("bookie-1", lac_request, 10)
            assert got == lac_answer
            assert asked == [pb.ReadLacRequest.FromString(lac_request)]
            assert await collect(await reads.read_range("bookie-1", request(0, 1), 10)) == [
                pb.ReadRangeResponse(code=pb.NO_SUCH_ENTRY, lac=7)
            ]
            # Two answers to a ReadLac: a broken bookie, and the connection is not kept.
            with pytest.raises(BookieError, match="not answered by one frame"):
                await reads.read_lac("bookie-1", lac_request, 10)
            assert not reads._open
            reads.close()
        assert hellos == ["bookie-1"]
        async with Bookie(older) as address:
            reads = reads_of([address])
            assert await reads.read_lac("bookie-1", lac_request, 10) is None
            assert await reads.read_range("bookie-1", request(0, 1), 10) is None

    asyncio.run(main())
