"""An Add stream over a bookie's data port (`stream.wire.frames`): the writer's batches framed
over one TCP connection (TLS with the client's files), answered in order. A bookie without a
data port (turned off, or older) gets the batches over gRPC's Add instead. A bookie of a
release before version 2 (`frames.PREAMBLE`) refuses its preamble before it takes any batch:
the stream then opens version 1 (`frames.PREAMBLE_V1`, answers naming every id) and sends the
same batches there, so writers need not wait for every bookie to be upgraded.

Runs on the client's event loop, as an asyncio protocol: a batch is written to the socket when
it is sent (no sender task, no wake-up per batch), and answers are cut from what the socket
delivers."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from stream.client.ports import AddBatch, AddStream, fail_waiting
from stream.logs import get_logger
from stream.wire import bookie_pb2 as pb
from stream.wire import frames

log = get_logger(__name__)

# An answer is a few bytes per entry: a frame this large is not one.
_MAX_ANSWER = 64 << 20
_ANSWER = frames.ANSWER[0]
# A closed stream waits this long for the answers in flight, then drops the connection (as the
# gRPC stream does).
_CLOSE_WAIT_S = 1.0

# Connects `protocol` to the data port at an address: (address, protocol) -> its transport.
Connect = Callable[[str, asyncio.BaseProtocol], Awaitable[asyncio.Transport]]
# A bookie's data port address: (bookie id, re-read the registry) -> address, or None.
ResolveData = Callable[[str, bool], Awaitable[str | None]]


class _Link(asyncio.Protocol):
    """One connection of a stream: hands its events to the stream until it is cut (the stream
    left it for another connection)."""

    __slots__ = ("stream",)

    def __init__(self, stream: DataPortAddStream) -> None:
        self.stream: DataPortAddStream | None = stream

    def data_received(self, data: bytes) -> None:
        if self.stream is not None:
            self.stream.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:
            self.stream.connection_lost(exc)


class DataPortAddStream:
    """One Add stream to `bookie_id` over its data port; `AddStream` for the pipeline."""

    def __init__(
        self,
        bookie_id: str,
        resolve: ResolveData,
        connect: Connect,
        fallback: Callable[[], AddStream],
        broken: Callable[[str], Exception],
    ) -> None:
        """`fallback` opens a gRPC Add stream, for a bookie without a data port; `broken`
        makes the exception that unanswered batches get when the stream breaks."""
        self._bookie_id = bookie_id
        self._broken = broken
        self._connect = connect
        self._loop = asyncio.get_running_loop()
        self._futures: deque[asyncio.Future[pb.AddResponse]] = deque()
        # Batches sent before the connection is up (with their futures, already in _futures).
        self._waiting: list[AddBatch] | None = []
        # Batches sent over a version 2 connection not answered yet once: sent again over
        # version 1 if the bookie refuses version 2 (then it took none of them).
        self._unconfirmed: list[AddBatch] | None = None
        self._preamble = frames.PREAMBLE
        self._address = ""  # the data port connected to
        self._transport: Any = None
        self._link: _Link | None = None
        self._fallback: AddStream | None = None
        self._buffer = bytearray()
        self._error: Exception | None = None
        self._closed = False
        self._close_timer: asyncio.TimerHandle | None = None
        self._task = asyncio.ensure_future(self._connecting(self._open(resolve, fallback)))

    # -- AddStream ----------------------------------------------------------------------

    def send(self, batch: AddBatch) -> asyncio.Future[pb.AddResponse]:
        if self._fallback is not None:
            return self._fallback.send(batch)
        future: asyncio.Future[pb.AddResponse] = self._loop.create_future()
        if self._error is not None or self._closed:
            future.set_exception(self._error or self._broken("add stream closed"))
            return future
        self._futures.append(future)
        if self._waiting is not None:
            self._waiting.append(batch)
        else:
            self._transport.write(batch.to_frame())
            if self._unconfirmed is not None:
                self._unconfirmed.append(batch)
        return future

    def close(self) -> None:
        if self._fallback is not None:
            self._fallback.close()
            return
        if self._closed:
            return
        self._closed = True
        if self._transport is None:
            if not self._task.done():
                self._task.cancel()
            self._fail(self._broken("add stream closed"))
        elif not self._futures:
            self._transport.close()
        else:  # let the answers in flight arrive first
            self._close_timer = self._loop.call_later(_CLOSE_WAIT_S, self._transport.close)

    # -- connecting ---------------------------------------------------------------------

    async def _open(self, resolve: ResolveData, fallback: Callable[[], AddStream]) -> None:
        address = await resolve(self._bookie_id, False)
        if address is None:
            self._use_fallback(fallback())
            return
        try:
            await self._connect_to(address)
        except OSError:
            # The data port may have moved (a bookie restarted with another `data_listen`): read
            # its registration again.
            fresh = await resolve(self._bookie_id, True)
            if fresh is None or fresh == address:
                raise
            await self._connect_to(fresh)

    async def _connecting(self, opening: Awaitable[None]) -> None:
        """Awaits `opening` (a connection being made); its failure fails the stream."""
        try:
            await opening
        except asyncio.CancelledError:
            self._fail(self._broken("add stream closed"))
            raise
        except Exception as e:
            self._fail(self._broken(f"cannot open the data port: {e!r}"))

    async def _connect_to(self, address: str) -> None:
        """Connects to `address` and sends the preamble and the batches waiting."""
        link = _Link(self)
        transport = await self._connect(address, link)
        if self._error is not None or self._closed:
            link.stream = None
            transport.close()
            return
        self._transport, self._link, self._address = transport, link, address
        waiting, self._waiting = self._waiting or [], None
        if self._preamble == frames.PREAMBLE:
            self._unconfirmed = list(waiting)
        head = self._preamble + frames.frame(self._bookie_id.encode())
        transport.write(b"".join([head, *(batch.to_frame() for batch in waiting)]))

    def _use_version_1(self) -> None:
        """The bookie refused version 2 before taking any batch: the batches sent go again,
        in order, over a new version 1 connection."""
        log.info("data_port.version_1", bookie=self._bookie_id)
        assert self._link is not None
        self._link.stream = None
        self._transport.abort()
        self._transport = self._link = None
        self._waiting, self._unconfirmed = self._unconfirmed, None
        self._buffer.clear()
        self._preamble = frames.PREAMBLE_V1
        self._task = asyncio.ensure_future(self._connecting(self._connect_to(self._address)))

    def _use_fallback(self, stream: AddStream) -> None:
        self._fallback = stream
        waiting, self._waiting = self._waiting or [], None
        futures, self._futures = self._futures, deque()
        for batch, future in zip(waiting, futures, strict=True):
            _chain(stream.send(batch), future)
        if self._closed:
            stream.close()

    # -- the connection's events (through its _Link) --------------------------------------

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        size = len(buffer)
        at = 0
        unpack = frames.LENGTH.unpack_from
        while size - at >= 4:
            (length,) = unpack(buffer, at)
            if length == 0 or length > _MAX_ANSWER:
                self._protocol_error(f"an answer frame of {length} bytes")
                return
            if size - at - 4 < length:
                break
            kind = buffer[at + 4]
            body = bytes(buffer[at + 5 : at + 4 + length])
            at += 4 + length
            if kind != _ANSWER:
                reason = body.decode("utf-8", "replace")
                if self._unconfirmed is not None and reason.startswith(frames.UNKNOWN_PREAMBLE):
                    self._use_version_1()
                    return
                self._protocol_error(f"the bookie refused the add stream: {reason}")
                return
            self._unconfirmed = None
            if not self._futures:
                self._protocol_error("an answer to no batch")
                return
            future = self._futures.popleft()
            if not future.done():
                try:
                    future.set_result(pb.AddResponse.FromString(body))
                except Exception as e:  # DecodeError: the connection cannot be trusted
                    self._protocol_error(f"a malformed answer: {e!r}")
                    return
        if at:
            del buffer[:at]
        if self._closed and not self._futures and self._transport is not None:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._close_timer is not None:
            self._close_timer.cancel()
        reason = "add stream ended" if exc is None else f"add stream failed: {exc!r}"
        self._fail(self._broken(reason))

    def _protocol_error(self, reason: str) -> None:
        self._fail(self._broken(reason))
        if self._transport is not None:
            self._transport.close()

    def _fail(self, error: Exception) -> None:
        if self._error is None:
            self._error = error
        fail_waiting(self._futures, self._error)
        self._waiting = None


def _chain(source: asyncio.Future[pb.AddResponse], target: asyncio.Future[pb.AddResponse]) -> None:
    def copy(done: asyncio.Future[pb.AddResponse]) -> None:
        if target.done():
            return
        if done.cancelled():
            target.cancel()
        elif (error := done.exception()) is not None:
            target.set_exception(error)
        else:
            target.set_result(done.result())

    source.add_done_callback(copy)
