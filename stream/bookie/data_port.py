"""The bookie's data port (`data_listen`): Add streams framed over TCP (`stream.wire.frames`),
TLS as the gRPC port has it, each served by the gRPC Add's own handler (`BookieService.Add`):
the same parsing, term rule, metadata checks, backpressure and answers. Only the edge differs:
a connection is admitted by `AccessControl.admit` once its preamble arrived, and a fault of
the connection itself is answered by a refusal frame, then the connection closes."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator

import structlog

from stream.bookie import metrics
from stream.bookie.access import CALLER, AccessControl, Caller
from stream.bookie.config import BookieConfig
from stream.bookie.server import BookieService
from stream.errors import ConfigError
from stream.security.tls import ServerCredentials
from stream.wire import frames

log = structlog.get_logger(__name__)

# A connection that has not sent its preamble (and finished its TLS handshake) by then is
# dropped: a half-open connection holds nothing.
_HANDSHAKE_TIMEOUT_S = 10.0
# Bookie ids are at most 128 characters (stream.bookie.config).
_MAX_BOOKIE_ID = 512
# Read this much ahead of the handler: a few batches (the Add handler's queue bounds how many
# batches are taken at once; beyond that, TCP pushes back on the writer).
_READ_AHEAD_BYTES = 4 << 20
# Dead writers (a killed host) are noticed by TCP keepalive, as gRPC's keepalive notices them
# on the gRPC port: idle 30 s, then 3 probes 10 s apart.
_KEEPALIVE = ((socket.TCP_KEEPIDLE, 30), (socket.TCP_KEEPINTVL, 10), (socket.TCP_KEEPCNT, 3))


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


class FrameError(Exception):
    """A frame the data port refuses (the connection closes after a refusal frame)."""


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
        self._connections: set[asyncio.Task[None]] = set()
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
        self._server = await asyncio.start_server(
            self._serve,
            sock=listening,
            ssl=None if self._tls is None else self._tls.ssl_context,
            ssl_handshake_timeout=_HANDSHAKE_TIMEOUT_S if self._tls is not None else None,
            limit=_READ_AHEAD_BYTES,
        )

    async def stop(self, grace_s: float) -> None:
        """Stops accepting; streams still open get `grace_s` to finish their answers, then are
        cancelled (or closes the port, when it never served)."""
        if self._listening is not None:
            self._listening.close()
        if self._server is not None:
            self._server.close()
        if self._connections:
            await asyncio.wait(set(self._connections), timeout=grace_s)
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), _HANDSHAKE_TIMEOUT_S)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = _peer_name(writer.get_extra_info("peername"))
        outcome: str | None = "dropped"
        try:
            _tune(writer.get_extra_info("socket"))
            outcome = await self._connection(reader, writer, peer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, TimeoutError) as e:
            log.info("data_port.connection_dropped", peer=peer, error=repr(e))
        except Exception:
            log.exception("data_port.connection_failed", peer=peer)
        finally:
            if outcome is not None:
                metrics.DATA_PORT_CONNECTIONS.labels(outcome=outcome).inc()
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> str | None:
        """Serves one connection; returns how it went (`DATA_PORT_CONNECTIONS`' outcome; None:
        counted already, as served when admitted)."""
        preamble = await asyncio.wait_for(
            reader.readexactly(len(frames.PREAMBLE)), _HANDSHAKE_TIMEOUT_S
        )
        if preamble != frames.PREAMBLE:
            return await _refuse(writer, f"not a data port client: expected {frames.PREAMBLE!r}")
        (size,) = frames.LENGTH.unpack(
            await asyncio.wait_for(reader.readexactly(frames.LENGTH.size), _HANDSHAKE_TIMEOUT_S)
        )
        if size > _MAX_BOOKIE_ID:
            return await _refuse(writer, f"a bookie id of {size} bytes")
        meant = await asyncio.wait_for(reader.readexactly(size), _HANDSHAKE_TIMEOUT_S)
        if meant != self._bookie_id:
            name = meant.decode("utf-8", "replace")
            return await _refuse(writer, f"this is bookie {self._config.bookie_id}, not {name}")
        caller = self._caller(writer, peer)
        refusal = self._access.admit("Add", None, caller)
        if refusal is not None:
            return await _refuse(writer, refusal)
        CALLER.set(caller)  # the Add handler's reader task copies this context
        metrics.DATA_PORT_CONNECTIONS.labels(outcome="served").inc()
        requests = _requests(reader, self._max_frame)
        try:
            assert self._service is not None  # connections come once it serves
            async for response in self._service.Add(requests, _Peer(peer)):  # type: ignore[arg-type]
                data = response.SerializeToString()
                writer.write(frames.length_prefix(len(data) + 1) + frames.ANSWER + data)
                await writer.drain()
        except FrameError as e:
            await _refuse(writer, str(e))
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError) as e:
            log.info("data_port.stream_broken", peer=peer, error=repr(e))
        return None

    def _caller(self, writer: asyncio.StreamWriter, peer: str) -> Caller:
        pem = None
        ssl_object = writer.get_extra_info("ssl_object")
        if ssl_object is not None:
            der = ssl_object.getpeercert(binary_form=True)
            if der:
                pem = ssl.DER_cert_to_PEM_cert(der).encode("ascii")
        return self._access.caller_of(pem, peer)


async def _requests(reader: asyncio.StreamReader, max_frame: int) -> AsyncIterator[bytes]:
    """Yields the serialized AddRequests the writer sends, until it closes its side; raises
    `FrameError` at a frame over `max_frame`."""
    length = frames.LENGTH
    while True:
        try:
            head = await reader.readexactly(length.size)
        except asyncio.IncompleteReadError as e:
            if e.partial:
                raise
            return  # the writer closed between frames: the stream's end
        (size,) = length.unpack(head)
        if size > max_frame:
            raise FrameError(f"a frame of {size} bytes is over this bookie's limit ({max_frame})")
        yield await reader.readexactly(size)


async def _refuse(writer: asyncio.StreamWriter, reason: str) -> str:
    log.warning(
        "data_port.refused", peer=_peer_name(writer.get_extra_info("peername")), reason=reason
    )
    data = reason.encode()
    writer.write(frames.length_prefix(len(data) + 1) + frames.REFUSAL + data)
    with contextlib.suppress(ConnectionError):
        await writer.drain()
    return "refused"


def _tune(sock: socket.socket | None) -> None:
    """Sets TCP_NODELAY and keepalive on an accepted connection. asyncio sets TCP_NODELAY only
    on sockets whose `proto` is IPPROTO_TCP, and `socket.create_server`'s (so its accepted
    ones') is 0: with Nagle on, an answer written while the previous one was unacknowledged
    waited for the writer's next batch to carry the ACK (measured: 17 ms round trips in runs
    of seconds at 15,000 appends/s, the p99 at 37 ms)."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in _KEEPALIVE:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
