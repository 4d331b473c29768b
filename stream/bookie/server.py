"""The bookie's gRPC service (grpc.aio): a thin edge over the transport-neutral request
handling of `stream.bookie.core`. It decodes requests (a malformed one answers BAD_REQUEST),
turns an unexpected exception into INTERNAL, counts every answer, runs the Add stream (many
batches in flight, answers in request order, backpressure) and frames ReadRange batches.

Everything here runs on the asyncio event loop thread, the only thread that may call the
storage engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar, cast

import grpc
from google.protobuf.message import DecodeError, Message

from stream.bookie import metrics
from stream.bookie.access import Context
from stream.bookie.codes import BAD_REQUEST, INTERNAL
from stream.bookie.config import BookieConfig
from stream.bookie.core import (
    MAX_LAC_WAITERS,
    VERSION,
    BookieCore,
    StartReport,
    Storage,
    _PendingAdd,
)
from stream.bookie.disk import DiskStatus
from stream.bookie.request_log import Peer
from stream.bookie.storage.scanned import AddRequest, parse_add
from stream.bookie.terms import MetadataTerms
from stream.framing.range_answer import FramedEntries
from stream.logs import get_logger
from stream.protocol.invariant import invariant
from stream.wire import bookie_pb2 as pb

SERVICE_NAME = "streamkeeper.v1.Bookie"

log = get_logger(__name__)

_Resp = TypeVar("_Resp")
# The RPCs of the proto, by name.
_METHODS = pb.DESCRIPTOR.services_by_name["Bookie"].methods_by_name
# A unary RPC's handler in the core: (request, context) -> response.
_Handle: TypeAlias = Callable[[Any, Context], Awaitable[Message]]


@dataclass(frozen=True)
class Malformed:
    """A request that did not parse (what the lenient deserializers give the handlers)."""

    error: str


def _lenient(request_type: Any) -> Callable[[bytes], Any]:
    """Returns a deserializer that gives `Malformed` for bytes that do not parse: grpc would
    otherwise fail the call with a logged traceback per garbage request, and the client would
    get no BAD_REQUEST."""

    def parse(data: bytes) -> Any:
        try:
            return request_type.FromString(data)
        except DecodeError as e:
            return Malformed(f"malformed {request_type.DESCRIPTOR.name}: {e}")

    return parse


# A serialized ReadRangeRequest, parsed (gRPC's ReadRange and the data port's).
parse_read_range = _lenient(pb.ReadRangeRequest)
# A serialized ReadLacRequest, parsed (the data port's; gRPC's parses its own the same way).
parse_read_lac = _lenient(pb.ReadLacRequest)


def _guarded(
    rpc: str,
    response_type: Callable[..., _Resp],
    handle: Callable[[Any, Context], Awaitable[_Resp]],
    count: Callable[[str, int], None],
) -> Callable[[Any, Context], Awaitable[_Resp]]:
    """Wraps the unary handler `handle` of `rpc`: a request that did not parse answers
    BAD_REQUEST, an unexpected exception answers INTERNAL (and is logged) instead of failing
    the call, and every answer is counted (`count`) by RPC and code."""
    has_code = "code" in _METHODS[rpc].output_type.fields_by_name

    async def handler(request: Any, context: Context) -> _Resp:
        if isinstance(request, Malformed):
            count(rpc, BAD_REQUEST)
            if not has_code:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)
            return response_type(code=BAD_REQUEST, message=request.error)
        try:
            response = await handle(request, context)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("rpc.internal_error", rpc=rpc)
            if not has_code:  # Info: no code field; fail the call, keep the server
                count(rpc, INTERNAL)
                await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {e!r}")
            response = response_type(code=INTERNAL, message=f"internal error: {e!r}")
        count(rpc, getattr(response, "code", pb.OK))  # Info has no code: it answered
        return response

    return handler


class BookieService:
    """The Bookie gRPC service over one `BookieCore` (`core`). `set_disk_status` switches
    read-only mode; `start_report` is what Info tells about the start."""

    def __init__(
        self,
        config: BookieConfig,
        storage: Storage,
        *,
        instance_id: str,
        start_report: StartReport,
        disk_status: DiskStatus | None = None,
        metadata_terms: MetadataTerms | None = None,
    ) -> None:
        """See `BookieCore`; `metadata_terms` None serves without the metadata checks."""
        self._config = config
        self.core = BookieCore(
            config,
            storage,
            instance_id=instance_id,
            start_report=start_report,
            disk_status=disk_status,
            metadata_terms=metadata_terms,
        )
        self._add_streams = 0
        # gRPC's ReadLac handler, for the data port's ReadLac (no gRPC context: it has a code).
        self._read_lac = _guarded(
            "ReadLac", pb.ReadLacResponse, self.core.read_lac, self.core.count
        )

    async def read_lac_answer(self, request: pb.ReadLacRequest | Malformed) -> bytes:
        """Returns the answer to one ReadLac, serialized: the data port's, by gRPC's
        definition (BAD_REQUEST for a request that did not parse, INTERNAL for a fault, and
        counted, as gRPC's handler does)."""
        response = await self._read_lac(request, cast(Context, None))
        return response.SerializeToString()

    # -- state set by the process (the core's) --------------------------------------------

    @property
    def disk_status(self) -> DiskStatus | None:
        """Returns the latest disk check (None before the first)."""
        return self.core.disk_status

    @property
    def read_only(self) -> bool:
        """Read-only: the disk is nearly full, or the bookie is being drained."""
        return self.core.read_only

    @property
    def draining(self) -> bool:
        return self.core.draining

    def set_draining(self, draining: bool) -> None:
        """Switches drain mode (`/bookies/draining/<bookie_id>` exists)."""
        self.core.set_draining(draining)

    def set_disk_status(self, status: DiskStatus) -> None:
        """Records the latest disk check; read-only mode follows it."""
        self.core.set_disk_status(status)

    @property
    def add_streams(self) -> int:
        """Returns how many Add streams are open now (for draining at shutdown)."""
        return self._add_streams

    # -- Add --------------------------------------------------------------------------------

    def start_raw_add(
        self, raw: bytes, context: Peer | None
    ) -> _PendingAdd | Coroutine[Any, Any, _PendingAdd]:
        """Parses one serialized AddRequest and hands it to the core: returns its pending
        answer (`BookieCore.start_add`), or a coroutine giving it when the batch's term needs
        a metadata check first (rare: await it before taking the next batch, whose answer
        comes after). A request that does not parse is answered BAD_REQUEST (the stream goes
        on), an unexpected exception INTERNAL. The Add stream's one definition of a batch,
        for gRPC and the data port alike."""
        try:
            request = parse_add(raw, self._config.max_entry_bytes)
        except DecodeError as e:
            metrics.ADD_BATCHES.inc()
            response = pb.AddResponse(message=f"malformed AddRequest: {e}")
            return response, None, [BAD_REQUEST], []
        try:
            item = self.core.start_add_now(request, raw, context)
        except Exception as e:
            return self._internal_add(request, e)
        return item if item is not None else self._start_checked_add(request, raw, context)

    async def _start_checked_add(
        self, request: AddRequest, raw: bytes, context: Peer | None
    ) -> _PendingAdd:
        try:
            return await self.core.start_add(request, raw, context)
        except Exception as e:
            return self._internal_add(request, e)

    def _internal_add(self, request: AddRequest, error: Exception) -> _PendingAdd:
        log.exception("rpc.internal_error", rpc="Add", stream_id=request.stream_id)
        return self.core.rejected_add(request, INTERNAL, f"internal error: {error!r}")

    def add_stream_opened(self) -> None:
        """Counts an Add stream (gRPC's or the data port's) as open."""
        self._add_streams += 1
        metrics.ADD_STREAMS.inc()

    def add_stream_closed(self) -> None:
        """Counts an Add stream as ended."""
        self._add_streams -= 1
        metrics.ADD_STREAMS.dec()

    async def _read_adds(
        self,
        requests: AsyncIterator[bytes],
        pending: asyncio.Queue[_PendingAdd | None],
        context: Context,
    ) -> None:
        """Reads batches and hands each to the core at once (many batches in flight), queueing
        its response; stops reading while the queue is full (backpressure to the writer). A
        batch is scanned without a message per entry where it can be (`parse_add`)."""
        ended_by: Exception | None = None
        try:
            async for raw in requests:
                item = self.start_raw_add(raw, context)
                await pending.put(item if isinstance(item, tuple) else await item)
        except Exception as e:  # the request stream broke: answer what was taken, then fail
            ended_by = e
        # Not in a `finally`: when cancelled, the writer side is gone and nobody reads it.
        await pending.put(None)
        if ended_by is not None:
            raise ended_by

    async def Add(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[bytes], context: Context
    ) -> AsyncIterator[pb.AddResponse]:
        """Streams one AddResponse per AddRequest (received serialized, see `add_to_server`),
        in request order, each once durable."""
        pending: asyncio.Queue[_PendingAdd | None] = asyncio.Queue(
            maxsize=self._config.add_max_inflight_batches
        )
        reader = asyncio.create_task(self._read_adds(request_iterator, pending, context))
        self.add_stream_opened()
        try:
            while (item := await pending.get()) is not None:
                yield await self.core.finish_add(item)
            # The reader ended (the writer half-closed); surface its failure, if any.
            await reader
        finally:
            self.add_stream_closed()
            if not reader.done():
                reader.cancel()

    # -- ReadRange --------------------------------------------------------------------------

    async def ReadRange(  # noqa: N802
        self, request: pb.ReadRangeRequest | Malformed, context: Context
    ) -> AsyncIterator[bytes]:
        """Streams the entries of [first_entry_id, last_entry_id] (`read_range_answers`)."""
        for answer in self.read_range_answers(request):
            yield answer

    def read_range_answers(
        self, request: pb.ReadRangeRequest | Malformed
    ) -> Generator[bytes, None, None]:
        """Yields the answers to one ReadRange, serialized: the entries of [first_entry_id,
        last_entry_id] in batches of at most `max_batch_bytes`, as the storage framed them
        from the entries it stores, after each batch's head; the last answer carries the
        code that ended the range. Counted once the range ends. The one definition of a
        ReadRange, for gRPC and the data port alike (each step reads the storage: the caller
        runs it on the event loop between its other work, as gRPC's handler does)."""
        if isinstance(request, Malformed):
            self.core.count("ReadRange", BAD_REQUEST)
            yield pb.ReadRangeResponse(code=BAD_REQUEST, message=request.error).SerializeToString()
            return
        code = pb.OK
        try:
            for head, records in self.core.read_range(request, raw=True):
                code = head.code
                yield _with_entries(head, records)
        except Exception as e:
            log.exception("rpc.internal_error", rpc="ReadRange", stream_id=request.stream_id)
            code = INTERNAL
            answer = pb.ReadRangeResponse(code=INTERNAL, message=f"internal error: {e!r}")
            yield answer.SerializeToString()
        finally:
            self.core.count("ReadRange", code)


def _with_entries(head: pb.ReadRangeResponse, records: list[Any] | FramedEntries) -> bytes:
    """Returns `head` serialized with `records` (a batch the storage framed as the answer's
    `entries`, or none) after it: no entry is parsed and built again."""
    serialized = head.SerializeToString()
    return records.with_head(serialized) if isinstance(records, FramedEntries) else serialized


def server_options(config: BookieConfig) -> list[tuple[str, int]]:
    """Returns the gRPC server options for `config` (message sizes, keepalive, windows)."""
    return [
        ("grpc.max_receive_message_length", config.grpc_max_message_bytes),
        ("grpc.max_send_message_length", config.grpc_max_message_bytes),
        # gRPC sets SO_REUSEPORT by default: a second bookie started on the same address would
        # bind too and be handed half of the connections. Bind exclusively.
        ("grpc.so_reuseport", 0),
        # Detect dead writers (kill -9 of a client host) so their Add streams end.
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        # See BookieConfig.grpc_stream_window_bytes.
        ("grpc.http2.lookahead_bytes", config.grpc_stream_window_bytes),
        # No frame size, TCP read chunk size, write buffer, BDP probe or zerocopy option: none
        # changed gRPC's CPU per Add message (~300 us at 180 messages/s, ~85% of it fixed:
        # thread wake-ups per completion-queue event), see bench/grpc_add_bench.py.
    ]


def add_to_server(service: BookieService, server: grpc.aio.Server) -> None:
    """Registers `service` on `server`. As the generated `add_BookieServicer_to_server`, except
    that Add receives each request serialized: the storage journals those bytes as they are."""
    unary = grpc.unary_unary_rpc_method_handler
    handlers = {
        "Add": grpc.stream_stream_rpc_method_handler(
            service.Add,
            request_deserializer=None,
            response_serializer=pb.AddResponse.SerializeToString,
        ),
        "ReadRange": grpc.unary_stream_rpc_method_handler(
            service.ReadRange,
            request_deserializer=parse_read_range,
            response_serializer=None,  # the answers come serialized
        ),
    }
    core = service.core
    unary_rpcs: list[tuple[str, type[Message], type[Message], _Handle]] = [
        ("Fence", pb.FenceRequest, pb.FenceResponse, core.fence),
        ("Read", pb.ReadRequest, pb.ReadResponse, core.read),
        ("ReadLac", pb.ReadLacRequest, pb.ReadLacResponse, core.read_lac),
        ("Truncate", pb.TruncateRequest, pb.TruncateResponse, core.truncate),
        ("Trim", pb.TrimRequest, pb.TrimResponse, core.trim),
        ("StreamState", pb.StreamStateRequest, pb.StreamStateResponse, core.stream_state),
        ("Info", pb.InfoRequest, pb.InfoResponse, core.info),
    ]
    for name, request_type, response_type, handle in unary_rpcs:
        handlers[name] = unary(
            _guarded(name, response_type, handle, core.count),
            request_deserializer=_lenient(request_type),
            response_serializer=response_type.SerializeToString,
        )
    invariant(set(handlers) == set(_METHODS), "every RPC of the proto has a handler")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


__all__ = [
    "MAX_LAC_WAITERS",
    "SERVICE_NAME",
    "VERSION",
    "BookieService",
    "Malformed",
    "StartReport",
    "add_to_server",
    "parse_read_lac",
    "parse_read_range",
    "server_options",
]
