"""The bookie's data port (`data_listen`): Add streams and range reads framed over TCP
(`stream.wire.frames`),
TLS as the gRPC port has it, each batch taken by the Add stream's one definition
(`BookieService.start_raw_add`, as gRPC's `Add` takes it): the same parsing, term rule,
metadata checks and answers, in request order, and the same bound of batches in flight. Only
the edge differs: a connection is admitted by `AccessControl.admit` once its preamble arrived,
a fault of the connection itself is answered by a refusal frame (then the connection closes),
and a connection is a protocol driven by the event loop's callbacks rather than tasks: a
batch costs no task switch, and the answers of a journal group go out in one write as its
sync completes (measured in docs/benchmarks.md). A connection whose preamble asks for range
reads is served by `RangeReads` (stream.bookie.data_port_reads) once admitted the same way."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import socket
import ssl
from collections import deque
from typing import Any, cast

from stream.bookie import metrics
from stream.bookie.access import CALLER, AccessControl, Caller
from stream.bookie.config import BookieConfig
from stream.bookie.core import _PendingAdd
from stream.bookie.data_port_reads import RangeReads
from stream.bookie.server import BookieService
from stream.errors import ConfigError
from stream.logs import get_logger
from stream.security.tls import ServerCredentials
from stream.wire import frames

log = get_logger(__name__)

# A connection that has not sent its preamble (and finished its TLS handshake) by then is
# dropped: a half-open connection holds nothing.
_HANDSHAKE_TIMEOUT_S = 10.0
# Bookie ids are at most 128 characters (stream.bookie.config).
_MAX_BOOKIE_ID = 512
# Dead writers (a killed host) are noticed by TCP keepalive, as gRPC's keepalive notices them
# on the gRPC port: idle 30 s, then 3 probes 10 s apart.
_KEEPALIVE = (30, 10, 3)
_LENGTH = frames.LENGTH
# The streams served: the RPC each preamble opens, and its version's difference: whether its
# Add answers name ranges (`BookieCore.answer_add`), whether its read requests start with
# their kind (ReadRange or ReadLac, `stream.wire.frames`).
_PREAMBLES = {
    frames.PREAMBLE: ("Add", True),
    frames.PREAMBLE_V1: ("Add", False),
    frames.READ_PREAMBLE: ("ReadRange", True),
    frames.READ_PREAMBLE_V1: ("ReadRange", False),
}
_PREAMBLE_BYTES = len(frames.PREAMBLE)
assert all(len(preamble) == _PREAMBLE_BYTES for preamble in _PREAMBLES)


class _Peer:
    """The `Peer` of a data port connection (who sent a request, for the refusal log)."""

    __slots__ = ("_peer",)

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer


def _peer_name(address: object) -> str:
    """Returns the peer as gRPC writes it (`ipv4:HOST:PORT`, `ipv6:[HOST]:PORT`)."""
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
    return str(address)


class DataPort:
    """The data port of one bookie: `start()` binds it, `stop()` closes it and its streams."""

    def __init__(
        self,
        config: BookieConfig,
        listening: socket.socket,
        access: AccessControl,
        tls: ServerCredentials | None,
    ) -> None:
        """Use `bind`."""
        self._config = config
        self._listening: socket.socket | None = listening
        self._service: BookieService | None = None
        self._access = access
        self._tls = tls
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        # The largest AddRequest taken, as on the gRPC port.
        self._max_frame = config.grpc_max_message_bytes
        self._bookie_id = config.bookie_id.encode()

    @classmethod
    def bind(
        cls, config: BookieConfig, access: AccessControl, tls: ServerCredentials | None
    ) -> DataPort | None:
        """Binds the data port (`data_listen`), None when it is off; raises ConfigError when
        it cannot (bound before the bookie touches its directories, as its gRPC port is)."""
        bind = config.data_bind()
        if bind is None:
            return None
        host, port = bind
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            listening = socket.create_server((host, port), family=family)
        except OSError as e:
            raise ConfigError(
                f"cannot listen on {config.data_listen} (the data port): {e}",
                key="data_listen",
            ) from e
        return cls(config, listening, access, tls)

    async def start(self, service: BookieService) -> None:
        """Serves `service`'s Add on the bound port."""
        listening, self._listening = self._listening, None
        assert listening is not None, "started twice"
        self._service = service
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Connection(self, service),
            sock=listening,
            ssl=None if self._tls is None else self._tls.ssl_context,
            ssl_handshake_timeout=_HANDSHAKE_TIMEOUT_S if self._tls is not None else None,
        )

    async def stop(self, grace_s: float) -> None:
        """Stops accepting; streams still open get `grace_s` to finish their answers, then are
        dropped (or closes the port, when it never served)."""
        if self._listening is not None:
            self._listening.close()
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.drain()
        if self._connections:
            await asyncio.wait([c.ended for c in self._connections], timeout=grace_s)
        for connection in list(self._connections):
            connection.abort()
        if self._connections:  # aborted: each ends at the loop's next turn
            await asyncio.wait([c.ended for c in self._connections], timeout=1.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), _HANDSHAKE_TIMEOUT_S)
            self._server = None

    def caller(self, transport: asyncio.BaseTransport, peer: str) -> Caller:
        """Returns who calls over `transport` (its TLS client certificate, if any)."""
        pem = None
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            der = ssl_object.getpeercert(binary_form=True)
            if der:
                pem = ssl.DER_cert_to_PEM_cert(der).encode("ascii")
        return self._access.caller_of(pem, peer)


class _Connection(asyncio.Protocol):
    """One data port connection: its preamble and bookie id, then one Add stream. Each
    complete frame is taken at once (`BookieService.start_raw_add`) unless a batch's term is
    being checked against the metadata (then later frames wait) or `add_max_inflight_batches`
    await their answers (then the connection stops reading, as the gRPC Add stream does);
    answers go out in request order as their journal groups complete."""

    def __init__(self, port: DataPort, service: BookieService) -> None:
        self._port = port
        self._service = service
        self._core = service.core
        self._max_inflight = port._config.add_max_inflight_batches
        self._loop = asyncio.get_running_loop()
        self.ended: asyncio.Future[None] = self._loop.create_future()
        self._transport: asyncio.Transport | None = None
        self._peer = ""
        self._request_peer = _Peer("")
        self._buffer = bytearray()
        # Set once admitted: the context the batches are taken in (CALLER is the caller).
        self._context: contextvars.Context | None = None
        self._refused = False
        self._closing = False
        self._ranged = False  # the stream's version names ranges in its answers
        self._reads: RangeReads | None = None  # a connection of range reads, once admitted
        # Batches taken, not yet answered, in request order.
        self._answers: deque[_PendingAdd] = deque()
        self._watched: asyncio.Future[Any] | None = None  # the last group waiter watched
        self._checking: asyncio.Task[_PendingAdd] | None = None  # a batch's term check
        self._reading = True
        self._writable = True
        self._writer_done = False  # the writer half-closed its side
        self._handshake_timer: asyncio.TimerHandle | None = None

    # -- the transport's callbacks ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a stream transport
        self._peer = _peer_name(transport.get_extra_info("peername"))
        self._request_peer = _Peer(self._peer)
        frames.tune(transport.get_extra_info("socket"), _KEEPALIVE)
        self._port._connections.add(self)
        self._handshake_timer = self._loop.call_later(_HANDSHAKE_TIMEOUT_S, self._too_slow)

    def data_received(self, data: bytes) -> None:
        if self._refused or self._closing:
            return
        self._buffer += data
        try:
            self._take_frames()
        except Exception:
            log.exception("data_port.connection_failed", peer=self._peer)
            self.abort()

    def eof_received(self) -> bool:
        self._writer_done = True
        if self._context is None or self._reads is not None:
            return False  # no stream yet, or range reads (nothing owed after a request): close
        self._close_when_answered()
        # The answers in flight still go out (TLS closes at the writer's end regardless).
        assert self._transport is not None
        return self._transport.get_extra_info("sslcontext") is None

    def pause_writing(self) -> None:
        self._writable = False
        if self._reads is not None:
            self._reads.pause_writing()
            return
        self._pause_reading()

    def resume_writing(self) -> None:
        self._writable = True
        if self._reads is not None:
            self._reads.resume_writing()
            return
        self._take_more()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if self._checking is not None:
            self._checking.cancel()
        self._port._connections.discard(self)
        if self._reads is not None:
            self._reads.stop()
        elif self._context is not None:
            self._service.add_stream_closed()
            if exc is not None or self._answers or self._buffer:
                # The writer went away with batches unanswered, or mid-frame: what was not
                # answered has an unknown fate, as when a gRPC stream fails.
                log.info("data_port.stream_broken", peer=self._peer, error=repr(exc))
        elif not self._refused:
            metrics.DATA_PORT_CONNECTIONS.labels(outcome="dropped").inc()
            log.info("data_port.connection_dropped", peer=self._peer, error=repr(exc))
        self._answers.clear()
        if not self.ended.done():
            self.ended.set_result(None)

    def drain(self) -> None:
        """The bookie stops: a connection of range reads closes after the range it serves
        (an Add stream is left to its writer, who closes it once it has its answers)."""
        if self._reads is not None:
            self._reads.drain()

    def abort(self) -> None:
        """Drops the connection at once (the bookie stops)."""
        if self._transport is not None:
            self._transport.abort()

    # -- the handshake ------------------------------------------------------------------------

    def _too_slow(self) -> None:
        self._handshake_timer = None
        if self._context is None and not self._refused:
            self.abort()

    def _admit(self) -> bool:
        """Reads the preamble and the bookie id from the buffer and admits the caller;
        returns whether the stream may start (False: wait for more, or refused)."""
        buffer = self._buffer
        end_preamble = _PREAMBLE_BYTES
        if len(buffer) < end_preamble:
            return False
        served = _PREAMBLES.get(bytes(buffer[:end_preamble]))
        if served is None:
            self._refuse(f"{frames.UNKNOWN_PREAMBLE}: expected one of {sorted(_PREAMBLES)!r}")
            return False
        end_length = end_preamble + _LENGTH.size
        if len(buffer) < end_length:
            return False
        (size,) = _LENGTH.unpack_from(buffer, end_preamble)
        if size > _MAX_BOOKIE_ID:
            self._refuse(f"a bookie id of {size} bytes")
            return False
        if len(buffer) < end_length + size:
            return False
        meant = bytes(buffer[end_length : end_length + size])
        del buffer[: end_length + size]
        port = self._port
        if meant != port._bookie_id:
            name = meant.decode("utf-8", "replace")
            self._refuse(f"this is bookie {port._config.bookie_id}, not {name}")
            return False
        assert self._transport is not None
        caller = port.caller(self._transport, self._peer)
        rpc, version_2 = served
        refusal = port._access.admit(rpc, None, caller)
        if refusal is not None:
            self._refuse(refusal)
            return False
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self._ranged = version_2
        context = contextvars.copy_context()
        context.run(CALLER.set, caller)  # read by the Add handling's refusal log and audit
        self._context = context
        metrics.DATA_PORT_CONNECTIONS.labels(outcome="served").inc()
        if rpc == "ReadRange":
            self._reads = RangeReads(
                self._service,
                self._transport,
                self._buffer,
                context,
                port._max_frame,
                self._refuse,
                admit=lambda rpc, request: port._access.admit(rpc, request, caller),
                kinded=version_2,
            )
        else:
            self._service.add_stream_opened()
        return True

    def _refuse(self, reason: str) -> None:
        """Answers a fault of the connection by a refusal frame and closes it."""
        log.warning("data_port.refused", peer=self._peer, reason=reason)
        self._refused = True
        if self._context is None:  # an admitted stream was counted as served
            metrics.DATA_PORT_CONNECTIONS.labels(outcome="refused").inc()
        data = reason.encode()
        assert self._transport is not None
        self._transport.write(frames.length_prefix(len(data) + 1) + frames.REFUSAL + data)
        self._transport.close()

    # -- the Add stream ---------------------------------------------------------------------

    def _take_frames(self) -> None:
        """Takes every complete frame in the buffer while the stream may take more."""
        if self._context is None and not self._admit():
            return
        if self._reads is not None:
            self._reads.take()
            return
        buffer = self._buffer
        context = self._context
        assert context is not None
        start_raw_add = self._service.start_raw_add
        peer = self._request_peer
        max_frame = self._port._max_frame
        available = len(buffer)
        start = 0
        with memoryview(buffer) as view:
            while (
                self._checking is None
                and len(self._answers) < self._max_inflight
                and self._writable
                and available - start >= _LENGTH.size
            ):
                (size,) = _LENGTH.unpack_from(view, start)
                if size > max_frame:
                    self._refuse(
                        f"a frame of {size} bytes is over this bookie's limit ({max_frame})"
                    )
                    return
                end = start + _LENGTH.size + size
                if end > available:
                    break
                raw = bytes(view[start + _LENGTH.size : end])
                start = end
                item = context.run(start_raw_add, raw, peer)
                if isinstance(item, tuple):
                    self._queue(item)
                else:  # the batch's term needs a metadata check: later frames wait for it
                    task = self._loop.create_task(item, context=context)
                    self._checking = task
                    task.add_done_callback(self._checked)
        if start:
            del buffer[:start]
        if self._checking is not None or len(self._answers) >= self._max_inflight:
            self._pause_reading()
        elif not self._reading and self._writable:
            self._reading = True
            assert self._transport is not None
            self._transport.resume_reading()

    def _checked(self, task: asyncio.Task[_PendingAdd]) -> None:
        if self._checking is task:
            self._checking = None
        if task.cancelled() or self._closing:
            return
        self._queue(task.result())
        self._take_more()

    def _take_more(self) -> None:
        if self._refused or self._closing or self._context is None:
            return
        try:
            self._take_frames()
        except Exception:
            log.exception("data_port.connection_failed", peer=self._peer)
            self.abort()
            return
        self._close_when_answered()

    def _pause_reading(self) -> None:
        if self._reading and self._transport is not None:
            self._reading = False
            self._transport.pause_reading()

    def _queue(self, item: _PendingAdd) -> None:
        """Queues a taken batch's answer; sends it (and what follows it, if durable) when it
        is first in line and durable."""
        self._answers.append(item)
        waiter = self._core.group_waits.waiter(item[1])
        if waiter is None:
            if len(self._answers) == 1:
                self._answer_ready()
        elif waiter is not self._watched:
            self._watched = waiter
            waiter.add_done_callback(self._group_done)

    def _group_done(self, _: asyncio.Future[Any]) -> None:
        if self._closing or self._transport is None:
            return
        self._answer_ready()
        self._take_more()

    def _answer_ready(self) -> None:
        """Writes, in one write, the answers first in line whose batches are durable."""
        answers = self._answers
        core = self._core
        out: list[bytes] = []
        while answers:
            item = answers[0]
            durable = item[1]
            if durable is not None and not durable.done():
                break
            answers.popleft()
            data = core.answer_add(item, ranged=self._ranged).SerializeToString()
            out += (frames.length_prefix(len(data) + 1), frames.ANSWER, data)
        if out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(out))

    def _close_when_answered(self) -> None:
        """Closes the connection once the writer half-closed and everything it sent is
        answered (an incomplete frame left: the stream is broken; it closes all the same)."""
        if (
            self._writer_done
            and not self._answers
            and self._checking is None
            and self._transport is not None
            and not self._closing
        ):
            if self._buffer:
                log.info("data_port.stream_broken", peer=self._peer, error="a frame cut short")
                self._buffer.clear()
            self._closing = True
            self._transport.close()
