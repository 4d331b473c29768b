"""The writer's side of a data port Add stream (stream.client.data_port) against a scripted
bookie on loopback: answers in order however the socket cuts them, a refusal fails what waits
with its reason, a bookie that refuses version 2 gets the batches over version 1, a moved port
is found again, and a bookie without a data port gets the batches over the fallback."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from stream.client.data_port import DataPortAddStream
from stream.client.grpc_transport import AddStreamBroken
from stream.client.ports import AddBatch, AddStream
from stream.wire import bookie_pb2 as pb
from stream.wire import frames

from ..polling import until

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def batch(request_id: int) -> AddBatch:
    return AddBatch(stream_id=5, term=1, lac=-1, lafr=-1, request_id=request_id)


def answer(request_id: int) -> bytes:
    body = frames.ANSWER + pb.AddResponse(stream_id=5, request_id=request_id).SerializeToString()
    return frames.length_prefix(len(body)) + body


def refusal(reason: str) -> bytes:
    body = frames.REFUSAL + reason.encode()
    return frames.length_prefix(len(body)) + body


async def read_hello(reader: asyncio.StreamReader, preamble: bytes = frames.PREAMBLE) -> str:
    assert await reader.readexactly(len(preamble)) == preamble
    (size,) = frames.LENGTH.unpack(await reader.readexactly(4))
    return (await reader.readexactly(size)).decode()


async def read_request(reader: asyncio.StreamReader) -> pb.AddRequest:
    (size,) = frames.LENGTH.unpack(await reader.readexactly(4))
    return pb.AddRequest.FromString(await reader.readexactly(size))


class Bookie:
    """A scripted data port on loopback."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.script, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def connect(address: str, protocol: asyncio.Protocol) -> asyncio.Transport:
    host, port = address.rsplit(":", 1)
    transport, _ = await asyncio.get_running_loop().create_connection(
        lambda: protocol, host, int(port)
    )
    return transport


def open_stream(
    addresses: list[str | None],
    fallback: Callable[[], AddStream] | None = None,
    resolved: list[bool] | None = None,
) -> DataPortAddStream:
    """A stream to bookie-1 whose registration reads `addresses` in turn (the last stays)."""

    async def resolve(bookie_id: str, fresh: bool) -> str | None:
        assert bookie_id == "bookie-1"
        if resolved is not None:
            resolved.append(fresh)
        return addresses.pop(0) if len(addresses) > 1 else addresses[0]

    def no_fallback() -> AddStream:
        raise AssertionError("no fallback expected")

    return DataPortAddStream(
        "bookie-1",
        resolve,
        connect,
        fallback=fallback or no_fallback,
        broken=lambda reason: AddStreamBroken(reason, bookie="bookie-1"),
    )


def test_answers_resolve_in_order_however_the_socket_cuts_them() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await read_hello(reader) == "bookie-1"
        ids = [(await read_request(reader)).request_id for _ in range(5)]
        assert ids == [1, 2, 3, 4, 5]
        data = b"".join(answer(i) for i in ids)
        for cut in (3, 1, 7, 2):  # one byte at a time, frames split and joined
            writer.write(data[:cut])
            await writer.drain()
            await asyncio.sleep(0.01)
            data = data[cut:]
        writer.write(data)
        await reader.read()  # until the writer closes

    async def run() -> None:
        async with Bookie(script) as address:
            stream = open_stream([address])
            futures = [stream.send(batch(i)) for i in range(1, 6)]  # before the connection
            answers = await asyncio.wait_for(asyncio.gather(*futures), 10)
            assert [a.request_id for a in answers] == [1, 2, 3, 4, 5]
            stream.close()

    asyncio.run(run())


def test_a_refusal_fails_every_waiting_batch_with_its_reason() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_hello(reader)
        await read_request(reader)
        writer.write(answer(1) + refusal("Add refused: principal 'r' (reader)"))
        writer.close()

    async def run() -> None:
        async with Bookie(script) as address:
            stream = open_stream([address])
            first, second = stream.send(batch(1)), stream.send(batch(2))
            assert (await asyncio.wait_for(first, 10)).request_id == 1
            with pytest.raises(AddStreamBroken, match="refused the add stream: Add refused"):
                await asyncio.wait_for(second, 10)
            with pytest.raises(AddStreamBroken, match="refused"):
                await stream.send(batch(3))

    asyncio.run(run())


def test_a_bookie_that_refuses_version_2_gets_every_batch_again_over_version_1() -> None:
    """A bookie of an older release refuses the version 2 preamble before it takes any frame:
    the batches sent meanwhile, and those sent while the stream reconnects, go over version
    1, in order, each answered once."""
    received: list[list[int]] = []

    async def older(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        preamble = await reader.readexactly(len(frames.PREAMBLE))
        (size,) = frames.LENGTH.unpack(await reader.readexactly(4))
        assert await reader.readexactly(size) == b"bookie-1"
        if preamble != frames.PREAMBLE_V1:
            # Refused once the writer has sent four batches on this connection.
            for _ in range(4):
                await read_request(reader)
            writer.write(refusal("not a data port client: expected one of [b'SKADD/1\\n']"))
            writer.close()
            return
        ids: list[int] = []
        received.append(ids)
        while len(ids) < 6:
            ids.append((await read_request(reader)).request_id)
            writer.write(answer(ids[-1]))
        await reader.read()

    async def run() -> None:
        async with Bookie(older) as address:
            stream = open_stream([address])
            futures = [stream.send(batch(i)) for i in (1, 2)]  # before the connection
            await until(lambda: stream._transport is not None)
            futures += [stream.send(batch(i)) for i in (3, 4)]  # on the version 2 connection
            await until(lambda: stream._preamble == frames.PREAMBLE_V1)
            futures += [stream.send(batch(i)) for i in (5, 6)]  # while it reconnects, or after
            answers = await asyncio.wait_for(asyncio.gather(*futures), 10)
            assert [a.request_id for a in answers] == [1, 2, 3, 4, 5, 6]
            stream.close()
        assert received == [[1, 2, 3, 4, 5, 6]]  # one version 1 connection, every batch once

    asyncio.run(run())


def test_a_moved_data_port_is_read_again_from_the_registration() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_hello(reader)
        writer.write(answer((await read_request(reader)).request_id))
        await reader.read()

    async def run() -> None:
        async with Bookie(script) as address:
            gone = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
            stale = f"127.0.0.1:{gone.sockets[0].getsockname()[1]}"
            gone.close()
            await gone.wait_closed()
            resolved: list[bool] = []
            stream = open_stream([stale, address], resolved=resolved)
            assert (await asyncio.wait_for(stream.send(batch(7)), 10)).request_id == 7
            assert resolved == [False, True]  # the cached address, then the registry again
            stream.close()

    asyncio.run(run())


class RecordingStream:
    """A fallback stream answering each batch at once."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.closed = False

    def send(self, sent: AddBatch) -> asyncio.Future[pb.AddResponse]:
        self.sent.append(sent.request_id)
        future: asyncio.Future[pb.AddResponse] = asyncio.get_running_loop().create_future()
        future.set_result(pb.AddResponse(request_id=sent.request_id))
        return future

    def close(self) -> None:
        self.closed = True


def test_a_bookie_without_a_data_port_gets_the_batches_over_the_fallback() -> None:
    async def run() -> None:
        fallback = RecordingStream()
        stream = open_stream([None], fallback=lambda: fallback)
        early = [stream.send(batch(i)) for i in (1, 2)]  # before the registration was read
        answers = await asyncio.wait_for(asyncio.gather(*early), 10)
        later = await stream.send(batch(3))
        assert [a.request_id for a in answers] + [later.request_id] == [1, 2, 3]
        assert fallback.sent == [1, 2, 3]
        stream.close()
        assert fallback.closed

    asyncio.run(run())


def test_close_waits_for_the_answers_in_flight_then_hangs_up() -> None:
    hung_up = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_hello(reader)
        request = await read_request(reader)
        await asyncio.sleep(0.2)  # answered after the writer closed its stream
        writer.write(answer(request.request_id))
        if await reader.read() == b"":
            hung_up.set()

    async def run() -> None:
        async with Bookie(script) as address:
            stream = open_stream([address])
            pending = stream.send(batch(9))
            await asyncio.sleep(0.05)
            stream.close()
            assert (await asyncio.wait_for(pending, 10)).request_id == 9
            await asyncio.wait_for(hung_up.wait(), 0.5)  # at once, not after the 1 s wait

    asyncio.run(run())
