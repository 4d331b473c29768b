"""The data port's accepted connections: answers go out at once (TCP_NODELAY), and a dead
writer is noticed (keepalive). Checked on the bookie's own end of a real loopback connection,
found among this process's file descriptors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import Any

from stream.bookie.access import AccessControl
from stream.bookie.config import BookieConfig
from stream.bookie.data_port import DataPort
from stream.bookie.durable import GroupWaits
from stream.sandbox.ports import free_port
from stream.wire import bookie_pb2 as pb
from stream.wire import frames


class _EchoService:
    """Answers every AddRequest at once with an empty AddResponse (the parts of
    `BookieService` the data port calls)."""

    def __init__(self) -> None:
        self.core = self
        self.group_waits = GroupWaits()

    def start_raw_add(self, raw: bytes, context: Any) -> Any:
        return pb.AddResponse(), None, [], []

    def answer_add(self, item: Any, *, ranged: bool = False) -> pb.AddResponse:
        return item[0]

    def add_stream_opened(self) -> None:
        pass

    def add_stream_closed(self) -> None:
        pass


def _socket_between(local: tuple[str, int], peer: tuple[str, int]) -> socket.socket:
    """Returns a duplicate of this process's socket connected from `local` to `peer`."""
    for name in os.listdir("/proc/self/fd"):
        try:
            candidate = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        with contextlib.suppress(OSError):
            if candidate.getsockname() == local and candidate.getpeername() == peer:
                return candidate
        candidate.close()
    raise AssertionError(f"no socket from {local} to {peer}")


def test_accepted_connections_send_each_answer_at_once() -> None:
    """`socket.create_server`'s accepted sockets have proto 0, so asyncio leaves Nagle on:
    the bookie sets TCP_NODELAY itself (without it an answer written behind an
    unacknowledged one waited for the writer's next batch)."""
    config = BookieConfig(
        bookie_id="b1",
        listen="127.0.0.1:1",
        metadata="127.0.0.1:2181/x",
        data_listen=f"127.0.0.1:{free_port()}",
    )

    async def main() -> None:
        port = DataPort.bind(config, AccessControl(config), None)
        assert port is not None
        address = port._listening.getsockname()  # type: ignore[union-attr]
        await port.start(_EchoService())  # type: ignore[arg-type]
        reader, writer = await asyncio.open_connection(*address)
        try:
            writer.write(
                frames.PREAMBLE
                + frames.frame(b"b1")
                + frames.frame(pb.AddRequest().SerializeToString())
            )
            (length,) = frames.LENGTH.unpack(await reader.readexactly(frames.LENGTH.size))
            assert (await reader.readexactly(length))[:1] == frames.ANSWER
            bookie_end = _socket_between(address, writer.get_extra_info("sockname"))
            with bookie_end:
                assert bookie_end.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                assert bookie_end.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        finally:
            writer.close()
            await port.stop(1.0)

    asyncio.run(main())
