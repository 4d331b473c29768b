"""`BookieTransport` over gRPC (grpc.aio): one channel per bookie, one `Add` bidi stream per
(writer, bookie) carrying pre-serialized AddRequests (the per-entry work is done once when the
entry is prepared, not per bookie nor per message), or the same stream over the bookie's data
port (`stream.client.data_port`) when it has one; range reads go there too
(`stream.client.data_port_reads`). Runs on the client's event loop."""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from stream.addresses import split_host_port
from stream.client.data_port import DataPortAddStream, ResolveData
from stream.client.data_port_reads import DataPortReads
from stream.client.ports import AddBatch, AddStream, fail_waiting
from stream.errors import BookieError
from stream.logs import get_logger
from stream.security.tls import TLSConfig, aio_channel
from stream.wire import bookie_pb2 as pb

if TYPE_CHECKING:
    # Imported with the first channel (`_entry`): a process whose calls all go over the data
    # ports (a Spark query's source runner learning the LACs) never loads gRPC (~27 ms).
    import grpc

    from stream.wire import bookie_pb2_grpc

log = get_logger(__name__)

ADD_METHOD = "/streamkeeper.v1.Bookie/Add"
READ_RANGE_METHOD = "/streamkeeper.v1.Bookie/ReadRange"

CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
    # Notice a dead bookie host on an idle connection.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]

Resolver = Callable[[str], Awaitable[str | None]]
# A data port that does not accept the connection by then is unreachable.
_CONNECT_TIMEOUT_S = 10.0


class AddStreamBroken(BookieError):
    """The Add stream to a bookie ended or failed; its unanswered batches have unknown fate."""


class _AddStream:
    """One Add call: a sender task writes queued requests in order, a reader resolves the
    futures in order (the bookie answers each request once, in order)."""

    def __init__(self, transport: GrpcTransport, bookie_id: str) -> None:
        self._transport = transport
        self._bookie_id = bookie_id
        self._loop = asyncio.get_running_loop()
        self._requests: deque[bytes] = deque()
        self._futures: deque[asyncio.Future[pb.AddResponse]] = deque()
        self._wake = asyncio.Event()
        self._closed = False
        self._error: BaseException | None = None
        self._call: Any = None
        self._task = asyncio.ensure_future(self._run())

    def send(self, batch: AddBatch) -> asyncio.Future[pb.AddResponse]:
        future: asyncio.Future[pb.AddResponse] = self._loop.create_future()
        if self._error is not None or self._closed:
            future.set_exception(
                AddStreamBroken("add stream closed", bookie=self._bookie_id)
                if self._error is None
                else self._error
            )
            return future
        self._requests.append(batch.to_bytes())
        self._futures.append(future)
        self._wake.set()
        return future

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        fail_waiting(self._futures, self._error)
        self._requests.clear()

    async def _run(self) -> None:
        reader: asyncio.Task[None] | None = None
        try:
            channel = await self._transport.channel(self._bookie_id)
            self._call = channel.stream_stream(
                ADD_METHOD,
                request_serializer=None,
                response_deserializer=pb.AddResponse.FromString,
            )()
            reader = asyncio.ensure_future(self._read(self._call))
            while True:
                while self._requests:
                    await self._call.write(self._requests.popleft())
                if self._closed:
                    if not self._futures:
                        break
                    # Let the answers in flight arrive before half-closing.
                    await asyncio.wait([reader], timeout=1.0)
                    break
                self._wake.clear()
                if self._requests:
                    continue
                await self._wake.wait()
            await self._call.done_writing()
        except asyncio.CancelledError:
            self._fail(AddStreamBroken("add stream cancelled", bookie=self._bookie_id))
            raise
        except Exception as e:
            self._fail(AddStreamBroken(f"add stream failed: {e!r}", bookie=self._bookie_id))
        finally:
            if self._closed and self._call is not None:
                self._call.cancel()
            if reader is not None and self._closed:
                reader.cancel()

    async def _read(self, call: Any) -> None:
        try:
            async for response in call:
                if not self._futures:
                    break
                future = self._futures.popleft()
                if not future.done():
                    future.set_result(response)
            self._fail(AddStreamBroken("add stream ended", bookie=self._bookie_id))
        except asyncio.CancelledError:
            self._fail(AddStreamBroken("add stream closed", bookie=self._bookie_id))
        except Exception as e:
            self._fail(AddStreamBroken(f"add stream failed: {e!r}", bookie=self._bookie_id))
            self._wake.set()


class GrpcTransport:
    """Bookie requests over gRPC; `resolve(bookie_id)` gives a bookie's address (from the
    registry). Create and use it on one event loop; `close()` closes every channel. With
    `tls`, every channel is TLS with those files (mutual, when it holds a certificate). The
    generated `BookieStub` is untyped: each answer is annotated with the type its RPC's
    deserializer gives."""

    def __init__(
        self,
        resolve: Resolver,
        *,
        options: list[tuple[str, Any]] | None = None,
        tls: TLSConfig | None = None,
        resolve_data: ResolveData | None = None,
        data_adds: bool = True,
        data_reads: bool = False,
    ):
        """`resolve_data`: where a bookie's data port is; with it, Add streams go there
        (`data_adds`) and range reads (`data_reads`), over gRPC to a bookie without one. Those
        two are the defaults of calls that do not say (`data_port=None`). With `tls`, ranges
        are read over the data port only when `data_reads` says so: a call cannot ask for it
        (gRPC's TLS costs less per byte than Python's, docs/benchmarks.md)."""
        self._resolve = resolve
        self._resolve_data = resolve_data
        self._data_adds = data_adds
        self._data_reads = data_reads
        self._reads = (
            DataPortReads(
                resolve_data,
                self._connect_data,
                lambda reason, bookie_id: BookieError(reason, bookie=bookie_id),
            )
            if resolve_data is not None and (tls is None or data_reads)
            else None
        )
        self._data_tls: ssl.SSLContext | None = None
        self._tls = tls
        self._options = options or CHANNEL_OPTIONS
        self._channels: dict[str, tuple[str, grpc.aio.Channel, bookie_pb2_grpc.BookieStub]] = {}

    async def channel(self, bookie_id: str) -> grpc.aio.Channel:
        """Returns the channel to `bookie_id`, resolving its address on first use."""
        return (await self._entry(bookie_id))[1]

    async def _entry(
        self, bookie_id: str
    ) -> tuple[str, grpc.aio.Channel, bookie_pb2_grpc.BookieStub]:
        entry = self._channels.get(bookie_id)
        if entry is not None:
            return entry
        address = await self._resolve(bookie_id)
        if address is None:
            raise BookieError("bookie is not registered", bookie=bookie_id)
        entry = self._channels.get(bookie_id)  # another task may have raced us here
        if entry is None:
            from stream.wire import bookie_pb2_grpc

            channel = aio_channel(address, self._tls, self._options)
            entry = (address, channel, bookie_pb2_grpc.BookieStub(channel))
            self._channels[bookie_id] = entry
        return entry

    async def _stub(self, bookie_id: str) -> bookie_pb2_grpc.BookieStub:
        return (await self._entry(bookie_id))[2]

    def open_add_stream(self, bookie_id: str, *, data_port: bool | None = None) -> AddStream:
        if self._resolve_data is None or not (self._data_adds if data_port is None else data_port):
            return _AddStream(self, bookie_id)
        return DataPortAddStream(
            bookie_id,
            self._resolve_data,
            self._connect_data,
            fallback=lambda: _AddStream(self, bookie_id),
            broken=lambda reason: AddStreamBroken(reason, bookie=bookie_id),
        )

    def _reads_over_data_port(self, data_port: bool | None) -> bool:
        """Whether a read (a range, a LAC) goes over the data port: the call's `data_port`,
        else the transport's default."""
        return self._data_reads if data_port is None else data_port

    async def _connect_data(
        self, address: str, protocol: asyncio.BaseProtocol
    ) -> asyncio.Transport:
        """Connects `protocol` to the data port at `address` (TLS with the client's files)."""
        host, port = split_host_port("data_address", address)
        if self._tls is not None and self._data_tls is None:
            self._data_tls = self._tls.client_context()
        loop = asyncio.get_running_loop()
        transport, _ = await asyncio.wait_for(
            loop.create_connection(
                lambda: protocol,
                host,
                port,
                ssl=self._data_tls,
                server_hostname=host if self._data_tls is not None else None,
            ),
            _CONNECT_TIMEOUT_S,
        )
        return transport

    async def fence(
        self, bookie_id: str, stream_id: int, term: int, *, timeout_s: float
    ) -> pb.FenceResponse:
        stub = await self._stub(bookie_id)
        request = pb.FenceRequest(stream_id=stream_id, term=term)
        response: pb.FenceResponse = await stub.Fence(request, timeout=timeout_s)
        return response

    async def read(
        self, bookie_id: str, stream_id: int, entry_id: int, *, term: int = 0, timeout_s: float
    ) -> pb.ReadResponse:
        stub = await self._stub(bookie_id)
        request = pb.ReadRequest(stream_id=stream_id, entry_id=entry_id, term=term)
        response: pb.ReadResponse = await stub.Read(request, timeout=timeout_s)
        return response

    def read_range(
        self,
        bookie_id: str,
        stream_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        max_batch_bytes: int = 0,
        timeout_s: float,
        data_port: bool | None = None,
    ) -> AsyncIterator[pb.ReadRangeResponse]:
        request = pb.ReadRangeRequest(
            stream_id=stream_id,
            first_entry_id=first_entry_id,
            last_entry_id=last_entry_id,
            max_batch_bytes=max_batch_bytes,
        )
        return self._read_range(
            bookie_id, request, pb.ReadRangeResponse.FromString, timeout_s, data_port
        )

    def read_range_raw(
        self,
        bookie_id: str,
        stream_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        max_batch_bytes: int = 0,
        timeout_s: float,
        data_port: bool | None = None,
    ) -> AsyncIterator[bytes | pb.ReadRangeResponse]:
        """`read_range` with the responses left serialized (no deserializer): the reader walks
        their bytes without a protobuf message per entry."""
        request = pb.ReadRangeRequest(
            stream_id=stream_id,
            first_entry_id=first_entry_id,
            last_entry_id=last_entry_id,
            max_batch_bytes=max_batch_bytes,
        )
        return self._read_range(bookie_id, request, None, timeout_s, data_port)

    async def _read_range(
        self,
        bookie_id: str,
        request: pb.ReadRangeRequest,
        deserializer: Callable[[bytes], pb.ReadRangeResponse] | None,
        timeout_s: float,
        data_port: bool | None,
    ) -> AsyncIterator[Any]:
        """One ReadRange call, its responses through `deserializer` (None: as sent), over the
        bookie's data port when it serves range reads and `data_port` (None: the transport's
        default) allows."""
        if self._reads is not None and self._reads_over_data_port(data_port):
            answers = await self._reads.read_range(
                bookie_id, request.SerializeToString(), timeout_s
            )
            if answers is not None:
                try:
                    async for answer in answers:
                        # protobuf parses any buffer (the stub says bytes).
                        yield answer if deserializer is None else deserializer(cast(bytes, answer))
                finally:
                    await answers.aclose()
                return
        channel = await self.channel(bookie_id)
        call = channel.unary_stream(
            READ_RANGE_METHOD,
            request_serializer=pb.ReadRangeRequest.SerializeToString,
            response_deserializer=deserializer,
        )(request, timeout=timeout_s)
        try:
            async for response in call:
                yield response
        finally:
            call.cancel()

    async def read_lac(
        self,
        bookie_id: str,
        stream_id: int,
        known_lac: int,
        *,
        wait_ms: int,
        timeout_s: float,
        data_port: bool | None = None,
    ) -> pb.ReadLacResponse:
        """Over the bookie's data port where ranges are read there (`data_port`, as for
        `read_range`; its answer is gRPC's)."""
        request = pb.ReadLacRequest(stream_id=stream_id, known_lac=known_lac, timeout_ms=wait_ms)
        if self._reads is not None and self._reads_over_data_port(data_port):
            answer = await self._reads.read_lac(bookie_id, request.SerializeToString(), timeout_s)
            if answer is not None:
                return pb.ReadLacResponse.FromString(answer)
        stub = await self._stub(bookie_id)
        response: pb.ReadLacResponse = await stub.ReadLac(request, timeout=timeout_s)
        return response

    async def truncate(
        self, bookie_id: str, stream_id: int, term: int, after_entry_id: int, *, timeout_s: float
    ) -> pb.TruncateResponse:
        stub = await self._stub(bookie_id)
        request = pb.TruncateRequest(stream_id=stream_id, term=term, after_entry_id=after_entry_id)
        response: pb.TruncateResponse = await stub.Truncate(request, timeout=timeout_s)
        return response

    async def trim(
        self, bookie_id: str, stream_id: int, before_entry_id: int, *, timeout_s: float
    ) -> pb.TrimResponse:
        stub = await self._stub(bookie_id)
        request = pb.TrimRequest(stream_id=stream_id, before_entry_id=before_entry_id)
        response: pb.TrimResponse = await stub.Trim(request, timeout=timeout_s)
        return response

    async def stream_state(
        self, bookie_id: str, stream_id: int, *, timeout_s: float
    ) -> pb.StreamStateResponse:
        stub = await self._stub(bookie_id)
        request = pb.StreamStateRequest(stream_id=stream_id)
        response: pb.StreamStateResponse = await stub.StreamState(request, timeout=timeout_s)
        return response

    async def close(self) -> None:
        """Closes every channel (calls in flight are cancelled) and data port connection."""
        if self._reads is not None:
            self._reads.close()
        channels, self._channels = self._channels, {}
        for _, channel, _ in channels.values():
            await channel.close()
