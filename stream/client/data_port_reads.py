"""ReadRange and ReadLac over a bookie's data port (`stream.wire.frames`): a connection carries
one request at a time, a range's answers received each straight into a buffer of its own size
(no copy but the kernel's; large ones reused once the reader is done with them,
`stream.client.answer_buffers`; gRPC copies each answer twice more and hands it over from its own
thread). Idle connections are kept per bookie for the next request. A process that reads
only over the data ports never makes a gRPC channel, nor imports gRPC.

A bookie without a data port, or one that refuses the reads' preamble (older than this
version), is read over gRPC: `DataPortReads.read_range` and `read_lac` answer None before
any answer, and the transport makes the gRPC call instead. Runs on the client's event loop."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from stream.client.answer_buffers import AnswerBuffers
from stream.client.data_port import Connect, ResolveData
from stream.wire import frames

# A ReadRange answer is at most the bookie's message limit; a frame this large is not one
# (gRPC's channels take up to the same).
_MAX_ANSWER = 256 << 20
_HEADER = frames.LENGTH.size + 1  # length, then the frame's kind
_ANSWER, _END, _REFUSAL = frames.ANSWER[0], frames.END[0], frames.REFUSAL[0]
# Received answers not yet taken by the reader: past this, the connection stops reading and
# the bookie stops its range (TCP's window), as gRPC's flow-control window does.
_QUEUED_ANSWERS = 2
# Idle connections kept per bookie (about the ranges a process reads from it at once).
_IDLE_PER_BOOKIE = 4
# TCP keepalive (idle, interval, probes; seconds), as the client's gRPC channels ping.
_KEEPALIVE = (10, 5, 1)

# An error of a range read: (reason, bookie id) -> the exception raised.
Broken = Callable[[str, str], Exception]


class _Connection(asyncio.BufferedProtocol):
    """One connection to a data port for range reads: received frames are queued as
    (kind, body) until taken (`next_frame`)."""

    def __init__(self, bookie_id: str, buffers: AnswerBuffers) -> None:
        self.bookie_id = bookie_id
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._header = bytearray(_HEADER)
        self._kind = 0
        self._body: bytearray | None = None  # the frame being received, after its header
        self._buffers = buffers
        self._got = 0
        self._frames: deque[tuple[int, bytearray]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: ConnectionError | None = None
        self._paused = False

    @property
    def usable(self) -> bool:
        return self._error is None and self.transport is not None and not self._frames

    def ended(self) -> bool:
        """Takes the range's END frame if it is all that was received and not taken: a
        range left after its last answer (a code that ends it) is then finished."""
        if len(self._frames) == 1 and self._frames[0][0] == _END and self._error is None:
            self._frames.popleft()
            return True
        return False

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self._fail(ConnectionResetError("closed by the reader"))

    async def next_frame(self, deadline: float) -> tuple[int, bytearray]:
        """Returns the next frame received; raises TimeoutError past `deadline` (loop
        time), ConnectionError once the connection is gone."""
        while not self._frames:
            if self._error is not None:
                raise self._error
            waiter = self._waiter = self._loop.create_future()
            timer = self._loop.call_at(deadline, _time_out, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        frame = self._frames.popleft()
        if self._paused and len(self._frames) < _QUEUED_ANSWERS and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return frame

    # -- asyncio.BufferedProtocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is None:
            return memoryview(self._header)[self._got :]
        return memoryview(self._body)[self._got :]

    def buffer_updated(self, nbytes: int) -> None:
        self._got += nbytes
        if self._body is None:
            if self._got < _HEADER:
                return
            (length,) = frames.LENGTH.unpack_from(self._header)
            if length == 0 or length > _MAX_ANSWER:
                self._protocol_error(f"a frame of {length} bytes")
                return
            self._kind = self._header[_HEADER - 1]
            self._body = self._buffers.take(length - 1)
            self._got = 0
            if length > 1:
                return
        elif self._got < len(self._body):
            return
        self._frames.append((self._kind, self._body))
        self._body = None
        self._got = 0
        if len(self._frames) >= _QUEUED_ANSWERS and not self._paused:
            self._paused = True
            assert self.transport is not None
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        reason = "the bookie closed the connection" if exc is None else f"lost: {exc!r}"
        self._fail(ConnectionResetError(reason))

    def _protocol_error(self, reason: str) -> None:
        self._fail(ConnectionError(reason))
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, error: ConnectionError) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def _time_out(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class DataPortReads:
    """The range reads of one transport over the bookies' data ports, with the idle
    connections kept per bookie."""

    def __init__(self, resolve: ResolveData, connect: Connect, broken: Broken) -> None:
        """`broken` makes the exception a range read raises when its connection fails."""
        self._resolve = resolve
        self._connect = connect
        self.broken = broken
        self._idle: dict[str, list[_Connection]] = {}
        self._open: set[_Connection] = set()
        # Bookies whose data port does not serve range reads (older): read over gRPC.
        self._grpc_only: set[str] = set()
        self._buffers = AnswerBuffers()

    async def read_range(
        self, bookie_id: str, request: bytes, timeout_s: float
    ) -> RangeAnswers | None:
        """Sends `request` (a serialized ReadRangeRequest) to `bookie_id`'s data port and
        returns its answers once the first arrived, within `timeout_s` for the whole range;
        None when this bookie is read over gRPC (no data port, a refusal: the gRPC call gives
        the answer, or the reason)."""
        sent = await self._send(bookie_id, frames.READ_RANGE + request, timeout_s)
        if sent is None:
            return None
        connection, first, deadline = sent
        return RangeAnswers(self, connection, first, deadline)

    async def read_lac(self, bookie_id: str, request: bytes, timeout_s: float) -> bytes | None:
        """Sends `request` (a serialized ReadLacRequest) to `bookie_id`'s data port and returns
        its answer (a serialized ReadLacResponse) within `timeout_s`; None when this bookie is
        read over gRPC, as for `read_range`."""
        sent = await self._send(bookie_id, frames.READ_LAC + request, timeout_s)
        if sent is None:
            return None
        answers = RangeAnswers(self, *sent)
        try:
            answer = await anext(answers, None)
            if answer is None or await anext(answers, None) is not None:
                raise self.broken("ReadLac was not answered by one frame", bookie_id)
            return bytes(answer)
        finally:
            await answers.aclose()

    async def _send(
        self, bookie_id: str, request: bytes, timeout_s: float
    ) -> tuple[_Connection, tuple[int, bytearray], float] | None:
        """Sends `request` (its kind, then the serialized request) over an idle or a new
        connection to `bookie_id`'s data port; returns the connection, the first frame of its
        answer and the request's deadline (loop time); None when this bookie is read over
        gRPC."""
        if bookie_id in self._grpc_only:
            return None
        deadline = asyncio.get_running_loop().time() + timeout_s
        idle = self._idle.get(bookie_id)
        while idle:
            connection = idle.pop()
            if not connection.usable:
                self.discard(connection)
                continue
            connection.send(frames.frame(request))
            try:
                first = await connection.next_frame(deadline)
            except ConnectionError:  # it went away while idle (the bookie restarted)
                self.discard(connection)
                continue
            except TimeoutError as e:
                raise self.failed(connection, e) from None
            except asyncio.CancelledError:
                self.discard(connection)  # its answers would come to no one
                raise
            return connection, first, deadline
        fresh = await self._connected(bookie_id)
        if fresh is None:
            return None
        hello = frames.READ_PREAMBLE + frames.frame(bookie_id.encode())
        fresh.send(hello + frames.frame(request))
        try:
            first = await fresh.next_frame(deadline)
        except (ConnectionError, TimeoutError) as e:
            raise self.failed(fresh, e) from None
        except asyncio.CancelledError:
            self.discard(fresh)
            raise
        if first[0] == _REFUSAL:
            self.discard(fresh)
            if first[1].decode("utf-8", "replace").startswith(frames.UNKNOWN_PREAMBLE):
                self._grpc_only.add(bookie_id)
            return None
        return fresh, first, deadline

    def failed(self, connection: _Connection, error: Exception) -> Exception:
        """Closes `connection`, whose request failed with `error`; returns what to raise."""
        self.discard(connection)
        reason = "timed out" if isinstance(error, TimeoutError) else f"failed: {error!r}"
        return self.broken(f"the read {reason}", connection.bookie_id)

    async def _connected(self, bookie_id: str) -> _Connection | None:
        """Returns a new connection to `bookie_id`'s data port; None when it has none."""
        address = await self._resolve(bookie_id, False)
        if address is None:
            return None
        connection = _Connection(bookie_id, self._buffers)
        try:
            try:
                await self._connect(address, connection)
            except OSError:
                # The data port may have moved (a bookie restarted with another `data_listen`):
                # read its registration again, as the Add stream does.
                fresh = await self._resolve(bookie_id, True)
                if fresh is None or fresh == address:
                    raise
                await self._connect(fresh, connection)
        except OSError as e:
            raise self.broken(f"cannot reach the data port: {e!r}", bookie_id) from None
        assert connection.transport is not None
        # A dead bookie host is noticed on an idle connection as gRPC's keepalive notices it.
        frames.tune(connection.transport.get_extra_info("socket"), _KEEPALIVE)
        self._open.add(connection)
        return connection

    def release(self, connection: _Connection) -> None:
        """Takes back `connection`, its range read to the end."""
        idle = self._idle.setdefault(connection.bookie_id, [])
        if len(idle) < _IDLE_PER_BOOKIE:
            idle.append(connection)
        else:
            self.discard(connection)

    def discard(self, connection: _Connection) -> None:
        """Closes `connection` (a range left unfinished, or failed)."""
        connection.close()
        self._open.discard(connection)

    def close(self) -> None:
        """Closes every connection (ranges being read fail)."""
        self._idle.clear()
        for connection in list(self._open):
            self.discard(connection)


class RangeAnswers:
    """The answers of one range (each a serialized ReadRangeResponse), taken in order: its
    connection goes back to the idle ones once the range ended, and is closed if it is closed
    (`aclose`) unfinished or fails."""

    def __init__(
        self,
        reads: DataPortReads,
        connection: _Connection,
        first: tuple[int, bytearray],
        deadline: float,
    ) -> None:
        self._reads = reads
        self._connection: _Connection | None = connection
        self._next: tuple[int, bytearray] | None = first
        self._deadline = deadline

    def __aiter__(self) -> RangeAnswers:
        return self

    async def __anext__(self) -> bytearray:
        connection = self._connection
        if connection is None:
            raise StopAsyncIteration
        kind, body = self._next or await self._receive(connection)
        self._next = None
        if kind == _ANSWER:
            return body
        self._connection = None
        if kind == _END:
            if connection.usable:
                self._reads.release(connection)
            else:
                self._reads.discard(connection)
            raise StopAsyncIteration
        self._reads.discard(connection)
        if kind == _REFUSAL:
            reason = body.decode("utf-8", "replace")
            raise self._reads.broken(f"the bookie refused the read: {reason}", connection.bookie_id)
        raise self._reads.broken(f"a frame of unknown kind {kind}", connection.bookie_id)

    async def _receive(self, connection: _Connection) -> tuple[int, bytearray]:
        try:
            return await connection.next_frame(self._deadline)
        except (TimeoutError, ConnectionError) as e:
            self._connection = None
            raise self._reads.failed(connection, e) from None

    async def aclose(self) -> None:
        """Ends the range here: an unfinished one's connection is closed, unless all that is
        left of it is its END frame (the reader stopped at a last answer whose code ended the
        range: the connection serves the next range)."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if self._next is None and connection.ended():
            self._reads.release(connection)
        else:
            self._reads.discard(connection)
