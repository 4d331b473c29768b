"""gRPC's own cost per Add message: CPU per message of a grpc.aio stream_stream client and of
the grpc.aio server answering it, each in its own process (as a writer and a bookie are), and
what a plain asyncio framed-TCP stream (as BookKeeper's own data path) costs instead.

The client streams `--messages` serialized messages of `--size` bytes (an AddRequest of ~114
1 KiB entries is ~117 KB) at `--rate` messages/s with up to `--window` unanswered, as the
writer's `_AddStream` does (`request_serializer=None`, one `write` per message); the server
answers each with a `--answer`-byte message (an AddResponse), in order, as `BookieService.Add`
does (a reader task queueing, the handler yielding). Nothing else runs: the figures are gRPC's
(plus asyncio's) fixed cost per message, to try channel/server options and environment
variables (GRPC_*: set them on the command line, both processes inherit them) against.

    .venv/bin/python bench/grpc_add_bench.py [--messages 2000] [--rate 180] [--size 117000]
        [--transport grpc|asyncio] [--server-protocol] [--tls]
        [--server-option grpc.http2.max_frame_size=65536] [--client-option NAME=VALUE]
        [--bookie-options] [--writer-options]

`--transport asyncio` sends the same messages over one TCP connection as frames (a 4-byte
big-endian length, then the message) through asyncio streams, no threads: the client the same
pacing and window, the server a reader task queueing answers and a coroutine writing them in
order; `--server-protocol` makes that server an asyncio.BufferedProtocol instead (the loop,
or the SSL layer, reads into its buffer: one copy fewer). `--tls` makes both transports mutual
TLS (a CA, a server and a client certificate made in a temporary directory by
stream.security.certs; the server requires the client's, as a bookie does by default).

`--bookie-options` / `--writer-options` start from the options the bookie and the writer use
(`server_options`, `CHANNEL_OPTIONS`); the `--*-option`s given are added after them (gRPC
takes the last value of a repeated name). `--threads` adds the CPU per message of each thread
(by name; the client's ended threads are not counted).

Measured (grpcio 1.85, 2 shared vCPUs, 180 messages/s as one bookie gets at 20,000 1 KiB
entries/s): about 300 us CPU per message on each side and 10.5 context switches per message
on the server (its event loop 3, the completion-queue poller thread 3, event_engine threads
5), of which ~85% is fixed: 1,000-byte messages cost 240-280 us. Each message is two
completion-queue events per side (receive and send), each handed from an event_engine thread
to grpc.aio's poller thread (futex) and from it to the event loop (a socketpair write). The
cost per message falls as the rate rises (about 175 us at 5,000/s): it is mostly waking idle
threads. None of max_frame_size, tcp_{min_,max_,}read_chunk_size, write_buffer_size,
bdp_probe=0, tcp_tx_zerocopy_enabled, GRPC_EXPERIMENTS=tcp_rcv_lowat,tcp_frame_size_tuning,
GRPC_POLL_STRATEGY=poll or GRPC_ENABLE_FORK_SUPPORT=0 moved the CPU or the context switches
per message beyond the run-to-run noise (~15%).

gRPC vs asyncio framed TCP (grpcio 1.85, CPython 3.11.7, TLS 1.3 from BoringSSL / OpenSSL;
2 shared vCPUs, load average 3.5-9.8 from the other helpers' work): `time.process_time` of
the client, /proc/PID/stat utime+stime of the server, and voluntary+involuntary context
switches of each process's live threads from /proc, over the measured run after a warm-up
connection; 2,000 messages at 180/s, 5,000 at 1,000/s (every run kept the rate); gRPC and
asyncio streams alternating, 3 pairs per line, then asyncio streams and --server-protocol
alternating, 3 more pairs (the "protocol" figures). The client's figures include the bench's
own pacing (one asyncio.sleep per message at these rates), the same for both transports.

    rate    size    TLS  CPU us/message, client      CPU us/message, server  switches/message
                         gRPC         asyncio      gRPC         asyncio      (median, cl | srv)
                                                                             gRPC      asyncio
    180/s   117 KB  no   397/342/409  199/200/206  365/290/330  125/115/135  3.9|11.2  2.0|1.6
    180/s   117 KB  yes  427/492/402  308/274/267  375/450/385  270/270/235  7.6|11.1  1.9|1.9
    180/s   1 KB    no   338/366/337  185/163/176  265/310/285  105/90/90    3.9|10.5  1.9|1.5
    180/s   1 KB    yes  360/307/417  215/228/270  305/245/325  160/170/190  7.8|10.4  2.0|1.9
    1000/s  117 KB  no   269/271/276  141/132/146  280/264/254  104/100/100  4.0|9.7   1.7|1.3
    1000/s  117 KB  yes  264/254/252  191/188/182  276/246/242  222/254/228  7.0|9.8   1.2|1.2
    1000/s  1 KB    no   274/283/286  126/120/125  242/248/238  66/62/68     3.3|9.2   1.6|1.1
    1000/s  1 KB    yes  244/269/243  135/111/123  222/218/222  94/78/84     3.7|9.9   1.6|1.3

The asyncio server's CPU us/message, streams vs --server-protocol (3 more alternating pairs;
the client and the context switches hardly change):

    rate    size    TLS  streams      protocol        rate    size    TLS  streams      protocol
    180/s   117 KB  no   140/140/145  125/140/125     1000/s  117 KB  no   98/90/106    74/72/70
    180/s   117 KB  yes  235/275/260  200/235/230     1000/s  117 KB  yes  172/206/184  140/144/144
    180/s   1 KB    no   90/115/100   80/100/90       1000/s  1 KB    no   56/56/64     52/62/46
    180/s   1 KB    yes  165/145/160  150/145/165     1000/s  1 KB    yes  90/94/86     86/82/74

So framed TCP on asyncio costs a server a third to two fifths of gRPC's CPU per plain message
(100-135 vs 255-365 us at 117 KB; 62-105 vs 240-310 us at 1 KB) and 1/5 to 1/8 of its context
switches (1.1-1.9 vs 9-11: the loop wakes about once per message, no thread hand-overs); the
client about half. TLS narrows the gap at 117 KB: BoringSSL inside gRPC adds ~0-55 us per
message, asyncio's sslproto (Python code copying each record between memory BIOs and the
StreamReader) ~125-135 us, so the TLS server costs 235-275 vs 375-450 us at 180/s and 172-254
vs 242-276 us at 1,000/s (client: 267-308 vs 402-492, 182-191 vs 252-264); a BufferedProtocol
server (SSLObject.read straight into its buffer) brings the asyncio figure to 200-235 and
140-144 us. At 1 KB TLS adds only ~20-80 us to asyncio. The asyncio server's 90-115 us for a
1 KB message at 180/s vs 46-68 us at 1,000/s is waking the idle loop. Noise ~15% run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import ssl
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

_METHOD = "/bench.Bench/Add"
# The asyncio transport's frame: a 4-byte big-endian length, then the message.
_HEADER = struct.Struct(">I")
_TICKS = os.sysconf("SC_CLK_TCK")


def _option(text: str) -> tuple[str, Any]:
    name, _, value = text.partition("=")
    return (name, int(value) if value.lstrip("-").isdigit() else value)


def _thread_cpu_s(pid: int) -> dict[str, float]:
    """Returns the CPU seconds so far of each thread of process `pid`, summed by name."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / _TICKS
    return out


def _switches(pid: int) -> int:
    """Returns the context switches (voluntary and not) of the live threads of `pid` so far:
    each is a wake-up or a hand-over, the fixed cost this bench is about."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _process_cpu_s(pid: int) -> float:
    """Returns the user+system CPU seconds of process `pid` (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


# -- TLS (mutual, as a bookie with TLS configured) -----------------------------------------


def _make_certs(directory: str) -> None:
    """Writes a CA, a server (`bookie`) and a client (`writer`) certificate into `directory`,
    with the project's own certificate code."""
    from pathlib import Path

    from stream.security.certs import create_ca, issue
    from stream.security.roles import Role

    create_ca(Path(directory))
    issue(Path(directory), "bookie", Role.SERVICE)
    issue(Path(directory), "writer", Role.WRITER)


def _read(directory: str, name: str) -> bytes:
    with open(os.path.join(directory, name), "rb") as f:
        return f.read()


def _ssl_context(directory: str, *, server: bool) -> ssl.SSLContext:
    if server:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(os.path.join(directory, "ca.crt"))
    else:
        context = ssl.create_default_context(cafile=os.path.join(directory, "ca.crt"))
    name = "bookie" if server else "writer"
    context.load_cert_chain(
        os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key")
    )
    return context


# -- the server (a child process) ----------------------------------------------------------


async def _serve_grpc(
    port_file: str, options: list[tuple[str, Any]], answer: bytes, tls_dir: str | None
) -> None:
    async def add(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        # As BookieService.Add: a reader task queues each request's answer; the handler
        # yields them in order.
        pending: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=64)

        async def read() -> None:
            async for raw in requests:
                await pending.put(answer if raw else b"")
            await pending.put(None)

        reader = asyncio.create_task(read())
        while (item := await pending.get()) is not None:
            yield item
        await reader

    server = grpc.aio.server(options=options)
    handler: Any = grpc.stream_stream_rpc_method_handler(add)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("bench.Bench", {"Add": handler}),)
    )
    if tls_dir is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        credentials = grpc.ssl_server_credentials(
            [(_read(tls_dir, "bookie.key"), _read(tls_dir, "bookie.crt"))],
            root_certificates=_read(tls_dir, "ca.crt"),
            require_client_auth=True,
        )
        port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    _publish(port_file, port)
    await server.wait_for_termination()


async def _serve_asyncio(
    port_file: str, answer: bytes, tls_dir: str | None, protocol: bool
) -> None:
    frame = _HEADER.pack(len(answer)) + answer

    async def add(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # As the gRPC server above: a reader task queues each request's answer; this
        # coroutine writes them in order.
        pending: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=64)

        async def read() -> None:
            try:
                while True:
                    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
                    raw = await reader.readexactly(size)
                    await pending.put(frame if raw else b"")
            except (asyncio.IncompleteReadError, ConnectionError):
                pass  # the client closed the connection
            await pending.put(None)

        task = asyncio.create_task(read())
        try:
            while (item := await pending.get()) is not None:
                writer.write(item)
                await writer.drain()
        except ConnectionError:
            pass
        await task
        writer.close()

    context = _ssl_context(tls_dir, server=True) if tls_dir is not None else None
    if protocol:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _AddProtocol(frame), "127.0.0.1", 0, ssl=context)
    else:
        server = await asyncio.start_server(add, "127.0.0.1", 0, ssl=context)
    _publish(port_file, server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


class _AddProtocol(asyncio.BufferedProtocol):
    """The asyncio server as a buffered protocol (`--server-protocol`): the loop (or, with TLS,
    the SSL layer) reads into this buffer directly, one copy fewer than a StreamReader; each
    complete frame is copied out as the bytes a parser would take and its answer queued for
    the answering coroutine."""

    def __init__(self, frame: bytes) -> None:
        self._frame = frame
        self._buffer = bytearray(1 << 20)
        self._view = memoryview(self._buffer)
        self._filled = 0
        self.pending: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=64)
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        asyncio.get_running_loop().create_task(self._answer())

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        start = needed = 0
        while self._filled - start >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer, start)
            end = start + _HEADER.size + size
            if end > self._filled:
                needed = end - start
                break
            raw = bytes(self._view[start + _HEADER.size : end])
            self.pending.put_nowait(self._frame if raw else b"")
            start = end
        if start:  # the partial frame left moves to the front (same length: no resize)
            self._buffer[: self._filled - start] = self._buffer[start : self._filled]
            self._filled -= start
        if needed > len(self._buffer):
            # A frame larger than the buffer: a new one (the loop may still hold a view of
            # the old, which then cannot be resized).
            buffer = bytearray(needed)
            buffer[: self._filled] = self._view[: self._filled]
            self._buffer, self._view = buffer, memoryview(buffer)
        assert self._transport is not None
        if self.pending.full():  # the next frame could not be queued: stop reading
            self._transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.pending.put_nowait(None)

    async def _answer(self) -> None:
        assert self._transport is not None
        while (item := await self.pending.get()) is not None:
            self._transport.write(item)
            if self.pending.qsize() < self.pending.maxsize // 2:
                self._transport.resume_reading()
        self._transport.close()


def _publish(port_file: str, port: int) -> None:
    with open(port_file + ".tmp", "w") as f:
        f.write(str(port))
    os.rename(port_file + ".tmp", port_file)


# -- the client (this process) -------------------------------------------------------------


async def _stream_grpc(
    port: int,
    options: list[tuple[str, Any]],
    message: bytes,
    count: int,
    rate: float,
    window: int,
    tls_dir: str | None,
) -> None:
    target = f"127.0.0.1:{port}"
    if tls_dir is None:
        channel = grpc.aio.insecure_channel(target, options=options)
    else:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(tls_dir, "ca.crt"),
            private_key=_read(tls_dir, "writer.key"),
            certificate_chain=_read(tls_dir, "writer.crt"),
        )
        channel = grpc.aio.secure_channel(target, credentials, options=options)
    async with channel:
        call: Any = channel.stream_stream(
            _METHOD, request_serializer=None, response_deserializer=None
        )()
        free = asyncio.Semaphore(window)

        async def read() -> None:
            async for _ in call:
                free.release()

        reader = asyncio.create_task(read())
        loop = asyncio.get_running_loop()
        started = loop.time()
        for n in range(count):
            due = started + n / rate
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await free.acquire()
            await call.write(message)
        await call.done_writing()
        await reader


async def _stream_asyncio(
    port: int, message: bytes, count: int, rate: float, window: int, tls_dir: str | None
) -> None:
    context = _ssl_context(tls_dir, server=False) if tls_dir is not None else None
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    free = asyncio.Semaphore(window)

    async def read() -> None:
        for _ in range(count):
            (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
            await reader.readexactly(size)
            free.release()

    task = asyncio.create_task(read())
    loop = asyncio.get_running_loop()
    started = loop.time()
    for n in range(count):
        due = started + n / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await free.acquire()
        # The header joined to each message (a copy): a writer would frame each serialized
        # request so.
        writer.write(_HEADER.pack(len(message)) + message)
        await writer.drain()
    await task
    writer.close()
    await writer.wait_closed()


async def _stream(
    args: argparse.Namespace, port: int, message: bytes, count: int, tls_dir: str | None
) -> None:
    if args.transport == "grpc":
        options = _client_options(args)
        await _stream_grpc(port, options, message, count, args.rate, args.window, tls_dir)
    else:
        await _stream_asyncio(port, message, count, args.rate, args.window, tls_dir)


def _spawn_server(
    args: argparse.Namespace, port_file: str, tls_dir: str | None
) -> subprocess.Popen[bytes]:
    command = [sys.executable, __file__, "--serve", port_file, "--answer", str(args.answer)]
    command += ["--transport", args.transport] + (["--tls-dir", tls_dir] if tls_dir else [])
    command += ["--server-protocol"] if args.server_protocol else []
    for name, value in _server_options(args):
        command += ["--server-option", f"{name}={value}"]
    return subprocess.Popen(command)


def _server_options(args: argparse.Namespace) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = []
    if args.bookie_options:
        from stream.bookie.config import BookieConfig
        from stream.bookie.server import server_options

        config = BookieConfig(listen="127.0.0.1:1", metadata="127.0.0.1:2181/b", bookie_id="b")
        options += [o for o in server_options(config) if o[0] != "grpc.so_reuseport"]
    return options + [_option(o) for o in args.server_option]


def _client_options(args: argparse.Namespace) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = []
    if args.writer_options:
        from stream.client.grpc_transport import CHANNEL_OPTIONS

        options += CHANNEL_OPTIONS
    return options + [_option(o) for o in args.client_option]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transport", choices=("grpc", "asyncio"), default="grpc")
    parser.add_argument(
        "--server-protocol",
        action="store_true",
        help="asyncio server as a BufferedProtocol, not streams",
    )
    parser.add_argument("--tls", action="store_true", help="mutual TLS (certificates made now)")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=180.0, help="messages/s")
    parser.add_argument("--window", type=int, default=8, help="messages unanswered at most")
    parser.add_argument("--size", type=int, default=117_000, help="request bytes")
    parser.add_argument("--answer", type=int, default=400, help="response bytes")
    parser.add_argument("--server-option", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--client-option", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--bookie-options", action="store_true")
    parser.add_argument("--writer-options", action="store_true")
    parser.add_argument("--threads", action="store_true", help="also CPU per thread")
    parser.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--tls-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    answer = b"a" * args.answer
    if args.serve:
        if args.transport == "grpc":
            options = [_option(o) for o in args.server_option]
            asyncio.run(_serve_grpc(args.serve, options, answer, args.tls_dir))
        else:
            asyncio.run(_serve_asyncio(args.serve, answer, args.tls_dir, args.server_protocol))
        return
    with tempfile.TemporaryDirectory(prefix="grpc_add_bench.") as tmp:
        tls_dir = tmp if args.tls else None
        if tls_dir is not None:
            _make_certs(tls_dir)
        _run(args, os.path.join(tmp, "port"), tls_dir)


def _run(args: argparse.Namespace, port_file: str, tls_dir: str | None) -> None:
    server = _spawn_server(args, port_file, tls_dir)
    try:
        while not os.path.exists(port_file):
            if server.poll() is not None:
                raise SystemExit(f"the server exited ({server.returncode})")
            time.sleep(0.05)
        with open(port_file) as f:
            port = int(f.read())
        message = bytes(range(256)) * (args.size // 256) + b"x" * (args.size % 256)
        # A short warm-up (connection, first allocations), then the measured run.
        warm = max(args.messages // 20, 10)
        asyncio.run(_stream(args, port, message, warm, tls_dir))
        pids = os.getpid(), server.pid
        threads0 = _thread_cpu_s(pids[0]), _thread_cpu_s(pids[1])
        switches0 = _switches(pids[0]), _switches(pids[1])
        client0, server0 = time.process_time(), _process_cpu_s(server.pid)
        wall0 = time.monotonic()
        asyncio.run(_stream(args, port, message, args.messages, tls_dir))
        wall = time.monotonic() - wall0
        client1, server1 = time.process_time(), _process_cpu_s(server.pid)
        switches1 = _switches(pids[0]), _switches(pids[1])
        threads1 = _thread_cpu_s(pids[0]), _thread_cpu_s(pids[1])
    finally:
        server.terminate()
        server.wait()
    n = args.messages
    print(
        f"{args.transport}{' protocol' if args.server_protocol else ''}"
        f"{' tls' if tls_dir else ''}: {n} messages of {args.size} B at "
        f"{args.rate:g}/s (got {n / wall:.0f}/s): "
        f"CPU us per message: client {(client1 - client0) / n * 1e6:.0f}, "
        f"server {(server1 - server0) / n * 1e6:.0f}; context switches per message: "
        f"client {(switches1[0] - switches0[0]) / n:.1f}, "
        f"server {(switches1[1] - switches0[1]) / n:.1f}"
    )
    if args.threads:
        for side, before, after in zip(("client", "server"), threads0, threads1, strict=True):
            shares = {name: (after[name] - before.get(name, 0.0)) / n * 1e6 for name in after}
            print(f"  {side} threads:", ", ".join(f"{k} {v:.0f}" for k, v in shares.items() if v))


if __name__ == "__main__":
    main()
