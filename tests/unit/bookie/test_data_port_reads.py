"""Range reads and ReadLac over the bookie's data port, over the real storage engine (in
tmp_path), in-process: the client's transport gets gRPC's answers byte for byte over one
connection, requests are served in order each ended by an END frame (a malformed one answered
BAD_REQUEST, the connection going on; version 2's requests of both kinds, a request of an
unknown kind refused), a ReadLac long poll answered when the LAC moves, a reader that takes
nothing stops the range, the caller's role is checked at the handshake and for each ReadLac,
and a stopping bookie closes its idle read connections at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from stream.bookie.access import AccessControl, Caller
from stream.bookie.data_port import DataPort
from stream.bookie.server import BookieService
from stream.client.grpc_transport import GrpcTransport
from stream.sandbox.ports import free_port
from stream.security.roles import RPC_ROLES, Role
from stream.wire import bookie_pb2 as pb
from stream.wire import frames

from ..polling import holds_for, until
from .storage_support import entry as checked_entry
from .test_server import Harness, start

_TIMEOUT_S = 10.0
Body = Callable[[Harness, DataPort, str], Awaitable[None]]


def run_reads(tmp_path: Path, body: Body, *, enforce: bool = False, **overrides: Any) -> None:
    """Runs `body(harness, port, data address)` against a service over the real storage with
    its data port started (roles enforced with `enforce`)."""
    overrides.setdefault("data_listen", f"127.0.0.1:{free_port()}")

    async def main() -> None:
        h, server = await start(tmp_path, **overrides)
        config = h.service._config
        access = AccessControl(config)
        access.enforce = enforce
        port = DataPort.bind(config, access, None)
        assert port is not None
        await port.start(h.service)
        try:
            await asyncio.wait_for(body(h, port, config.data_listen), 60)
        finally:
            await port.stop(1.0)
            await h.channel.close()
            await server.stop(0)
            h.storage.close()

    asyncio.run(main())


async def write(h: Harness, count: int, size: int, stream_id: int = 1) -> None:
    """Adds entries 0..count-1 of `size`-byte payloads (varied) to `stream_id`, committed."""
    for first in range(0, count, 200):
        ids = range(first, min(count, first + 200))
        request = pb.AddRequest(
            stream_id=stream_id,
            term=1,
            lac=ids[-1],
            lafr=-1,
            request_id=first,
            entries=[checked_entry(stream_id, i, bytes([i % 251]) * (size + i % 7)) for i in ids],
        )
        [answer] = [r async for r in h.stub.Add(iter([request]))]
        assert set(answer.codes) == {pb.OK}


def transports(h: Harness, data_address: str) -> tuple[GrpcTransport, GrpcTransport]:
    """A transport reading over gRPC only, and one reading over the data port."""
    listen = h.service._config.listen

    async def resolve(bookie_id: str) -> str:
        return listen

    async def resolve_data(bookie_id: str, fresh: bool) -> str:
        return data_address

    return GrpcTransport(resolve), GrpcTransport(
        resolve, resolve_data=resolve_data, data_adds=False, data_reads=True
    )


async def read_frames(reader: asyncio.StreamReader, count: int) -> list[tuple[bytes, bytes]]:
    """The next `count` frames as (kind, body)."""
    got = []
    for _ in range(count):
        head = await asyncio.wait_for(reader.readexactly(frames.LENGTH.size), _TIMEOUT_S)
        (size,) = frames.LENGTH.unpack(head)
        body = await asyncio.wait_for(reader.readexactly(size), _TIMEOUT_S)
        got.append((body[:1], body[1:]))
    return got


async def connect(
    address: str, bookie_id: str = "b1", preamble: bytes = frames.READ_PREAMBLE_V1
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A read connection of version 1 (requests without their kind), or of `preamble`'s."""
    host, number = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(number))
    writer.write(preamble + frames.frame(bookie_id.encode()))
    return reader, writer


def request(first: int, last: int, max_bytes: int = 0, stream_id: int = 1) -> bytes:
    return pb.ReadRangeRequest(
        stream_id=stream_id, first_entry_id=first, last_entry_id=last, max_batch_bytes=max_bytes
    ).SerializeToString()


def test_ranges_over_the_data_port_are_grpcs_answers_over_one_connection(tmp_path: Path) -> None:
    cases = [
        (0, 299, 0),  # all of it, one answer
        (0, 299, 10_000),  # in batches
        (17, 40, 1),  # an entry per answer
        (250, 400, 50_000),  # past the end: NO_SUCH_ENTRY last
        (5, 4, 0),  # malformed: BAD_REQUEST
    ]

    async def body(h: Harness, port: DataPort, address: str) -> None:
        await write(h, 300, 1000)
        grpc, data = transports(h, address)
        try:
            for first, last, max_bytes in cases:
                expected = [
                    bytes(a)
                    async for a in grpc.read_range_raw(
                        "b1", 1, first, last, max_batch_bytes=max_bytes, timeout_s=10
                    )
                ]
                got = [
                    bytes(a)
                    async for a in data.read_range_raw(
                        "b1", 1, first, last, max_batch_bytes=max_bytes, timeout_s=10
                    )
                ]
                assert got == expected, (first, last, max_bytes)
                messages = [
                    m
                    async for m in data.read_range(
                        "b1", 1, first, last, max_batch_bytes=max_bytes, timeout_s=10
                    )
                ]
                assert messages == [pb.ReadRangeResponse.FromString(a) for a in expected]
            unknown = [a async for a in data.read_range("b1", 9, 0, 5, timeout_s=10)]
            assert [a.code for a in unknown] == [pb.NO_SUCH_STREAM]
            assert len(port._connections) == 1  # every range over the one connection
        finally:
            await grpc.close()
            await data.close()

    run_reads(tmp_path, body)


def test_requests_are_served_in_order_each_ended_by_an_end_frame(tmp_path: Path) -> None:
    async def body(h: Harness, port: DataPort, address: str) -> None:
        await write(h, 10, 100)
        reader, writer = await connect(address)
        try:
            writer.write(
                frames.frame(request(0, 9, max_bytes=500))
                + frames.frame(b"\xff\xff\xff garbage")
                + frames.frame(request(3, 12))
            )
            ranges: list[list[pb.ReadRangeResponse]] = [[]]
            while len(ranges) < 4:
                [(kind, data)] = await read_frames(reader, 1)
                if kind == frames.END:
                    ranges.append([])
                else:
                    assert kind == frames.ANSWER
                    ranges[-1].append(pb.ReadRangeResponse.FromString(data))
            first, garbage, last, after = ranges
            assert after == []
            assert len(first) > 1
            assert [e.entry_id for a in first for e in a.entries] == list(range(10))
            assert {a.code for a in first} == {pb.OK}
            assert [a.code for a in garbage] == [pb.BAD_REQUEST]
            assert "malformed ReadRangeRequest" in garbage[0].message
            assert [e.entry_id for a in last for e in a.entries] == list(range(3, 10))
            assert last[-1].code == pb.NO_SUCH_ENTRY
        finally:
            writer.close()

    run_reads(tmp_path, body)


def test_a_reader_that_takes_nothing_stops_the_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bookie reads the next answer from its storage only once the socket took the last:
    a reader that takes nothing holds it to what the sockets hold."""
    produced = []
    original = BookieService.read_range_answers

    def counted(service: BookieService, req: Any) -> Generator[bytes, None, None]:
        for answer in original(service, req):
            produced.append(len(answer))
            yield answer

    monkeypatch.setattr(BookieService, "read_range_answers", counted)

    async def body(h: Harness, port: DataPort, address: str) -> None:
        await write(h, 2000, 16 << 10)  # about 32 MiB, read in answers of 64 KiB
        reader, writer = await connect(address)
        try:
            writer.write(frames.frame(request(0, 1999, max_bytes=64 << 10)))
            await until(lambda: produced)
            # Never more than the sockets hold, while the reader takes nothing (of about 500).
            assert await holds_for(1.0, lambda: len(produced) < 250)
            entries = ends = 0
            while not ends:
                [(kind, data)] = await read_frames(reader, 1)
                if kind == frames.END:
                    ends += 1
                else:
                    entries += len(pb.ReadRangeResponse.FromString(data).entries)
            assert entries == 2000 and len(produced) > 400
        finally:
            writer.close()

    run_reads(tmp_path, body)


def test_a_caller_without_the_reader_role_is_refused_at_the_handshake(tmp_path: Path) -> None:
    async def body(h: Harness, port: DataPort, address: str) -> None:
        reader, writer = await connect(address)
        writer.write(frames.frame(request(0, 9)))
        [(kind, data)] = await read_frames(reader, 1)
        assert (kind, data.decode()) == (
            frames.REFUSAL,
            "ReadRange refused: principal 'anonymous' (no role) is not allowed it; it needs "
            "the role reader",
        )
        assert await reader.read() == b""  # and the connection closed
        writer.close()

    run_reads(tmp_path, body, enforce=True)


def test_a_stopping_bookie_closes_idle_read_connections_at_once(tmp_path: Path) -> None:
    async def body(h: Harness, port: DataPort, address: str) -> None:
        await write(h, 10, 100)
        reader, writer = await connect(address)
        writer.write(frames.frame(request(0, 9)))
        kinds = [kind for kind, _ in await read_frames(reader, 2)]
        assert kinds == [frames.ANSWER, frames.END]
        # Idle now: the bookie does not wait out its grace period for it.
        await asyncio.wait_for(port.stop(30.0), 5.0)
        assert await asyncio.wait_for(reader.read(), 5.0) == b""
        writer.close()

    run_reads(tmp_path, body)


def lac_request(stream_id: int = 1, known_lac: int = -1, wait_ms: int = 0) -> bytes:
    return pb.ReadLacRequest(
        stream_id=stream_id, known_lac=known_lac, timeout_ms=wait_ms
    ).SerializeToString()


def test_read_lac_over_the_data_port_is_grpcs_answer_and_its_long_poll(tmp_path: Path) -> None:
    async def body(h: Harness, port: DataPort, address: str) -> None:
        await write(h, 10, 100)
        grpc, data = transports(h, address)
        try:
            # Known (at and below its LAC), an unknown stream, malformed (no stream, a
            # known_lac below -1): the same answers either way.
            for stream_id, known in [(1, -1), (1, 9), (7, -1), (0, -1), (1, -2)]:
                expected = await grpc.read_lac("b1", stream_id, known, wait_ms=0, timeout_s=10)
                got = await data.read_lac("b1", stream_id, known, wait_ms=0, timeout_s=10)
                assert got == expected, (stream_id, known)
                assert got.code in (pb.OK, pb.NO_SUCH_STREAM, pb.BAD_REQUEST)
            # A long poll is answered once the LAC moves past the one known.
            poll = asyncio.ensure_future(data.read_lac("b1", 1, 9, wait_ms=30_000, timeout_s=40))
            assert await holds_for(0.3, lambda: not poll.done())
            ids = range(10, 20)
            more = pb.AddRequest(
                stream_id=1,
                term=1,
                lac=19,
                lafr=-1,
                request_id=10,
                entries=[checked_entry(1, i, b"x" * 100) for i in ids],
            )
            [added] = [r async for r in h.stub.Add(iter([more]))]
            assert set(added.codes) == {pb.OK}
            answer = await asyncio.wait_for(poll, 10)
            assert (answer.code, answer.lac) == (pb.OK, 19)
            assert len(port._connections) == 1  # every ReadLac over the one connection
            assert data._channels == {}  # and never a gRPC channel
            # A reader that reads over gRPC (ReaderOptions.data_port = false) asks there.
            over_grpc = await data.read_lac("b1", 1, -1, wait_ms=0, timeout_s=10, data_port=False)
            assert over_grpc == answer
            assert list(data._channels) == ["b1"]
        finally:
            await grpc.close()
            await data.close()

    run_reads(tmp_path, body)


def test_version_2_serves_both_kinds_in_order_and_refuses_an_unknown_kind(tmp_path: Path) -> None:
    async def body(h: Harness, port: DataPort, address: str) -> None:
        await write(h, 10, 100)
        reader, writer = await connect(address, preamble=frames.READ_PREAMBLE)
        try:
            writer.write(
                frames.frame(frames.READ_LAC + lac_request())
                + frames.frame(frames.READ_RANGE + request(0, 9))
                + frames.frame(frames.READ_LAC + b"\xff\xff garbage")
                + frames.frame(b"X" + request(0, 9))
            )
            lac, end = await read_frames(reader, 2)
            assert lac[0] == frames.ANSWER and end[0] == frames.END
            assert pb.ReadLacResponse.FromString(lac[1]) == pb.ReadLacResponse(
                code=pb.OK, lac=9, lafr=-1
            )
            entries = []
            while True:
                [(kind, data)] = await read_frames(reader, 1)
                if kind == frames.END:
                    break
                entries += pb.ReadRangeResponse.FromString(data).entries
            assert [e.entry_id for e in entries] == list(range(10))
            garbage, end = await read_frames(reader, 2)
            assert end[0] == frames.END
            answer = pb.ReadLacResponse.FromString(garbage[1])
            assert answer.code == pb.BAD_REQUEST and "malformed ReadLacRequest" in answer.message
            [(kind, reason)] = await read_frames(reader, 1)
            assert (kind, reason.decode()) == (frames.REFUSAL, "a request of unknown kind 88")
            assert await reader.read() == b""  # and the connection closed
        finally:
            writer.close()

    run_reads(tmp_path, body)


def test_each_read_lac_is_checked_against_the_callers_role(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection is admitted for ReadRange; each ReadLac is admitted on its own (here
    ReadLac made to need more than the caller's reader role): refused, the connection closed."""
    monkeypatch.setitem(RPC_ROLES, "ReadLac", Role.WRITER)
    monkeypatch.setattr(
        AccessControl, "caller_of", lambda self, pem, peer: Caller("reader-x", peer, Role.READER)
    )

    async def body(h: Harness, port: DataPort, address: str) -> None:
        await write(h, 10, 100)
        reader, writer = await connect(address, preamble=frames.READ_PREAMBLE)
        try:
            writer.write(frames.frame(frames.READ_RANGE + request(0, 9)))
            kinds = [kind for kind, _ in await read_frames(reader, 2)]
            assert kinds == [frames.ANSWER, frames.END]  # the reader's ranges are served
            writer.write(frames.frame(frames.READ_LAC + lac_request()))
            [(kind, reason)] = await read_frames(reader, 1)
            assert (kind, reason.decode()) == (
                frames.REFUSAL,
                "ReadLac refused: principal 'reader-x' (reader) is not allowed it; it needs "
                "the role writer",
            )
            assert await reader.read() == b""
        finally:
            writer.close()

    run_reads(tmp_path, body, enforce=True)
