"""Delay and reordering without `sch_netem`: a transparent TCP relay on a host, for kernels
(like some VM kernels) that have no `tc netem`.

Every TCP connection made to the host's servers is redirected (an nftables `redirect` in the
host's namespace) to the relay, which reads the port it was meant for (`SO_ORIGINAL_DST`) and
opens its own connection to it. The client's address is kept, so partitions by address still
apply. While the control file names the host or the peer, each chunk is held for a delay drawn
from a normal distribution (mean and jitter, as netem's `delay D J distribution normal`). A
chunk never overtakes an earlier one of the same connection (TCP delivers in order, as it does
after netem's jitter); connections, each with its own draws, do overtake each other: a message
to one bookie arrives after a later one to another.

    python -m stream.sandbox.chaos.relay --port P --control FILE

The control file is JSON: {"hosts": [addresses], "delay_ms": D, "jitter_ms": J, "seed": S}; no
file or no hosts: no delay."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from stream.errors import StreamError
from stream.sandbox.netns import Host

# Linux's getsockopt for the address a redirected connection was sent to.
_SO_ORIGINAL_DST = 80
# Where the relay listens on each host (no server of the cluster uses it).
RELAY_PORT = 3999
_CHUNK_BYTES = 65536
# How often the relay looks at the control file: a fault's start and heal take effect within.
_CONTROL_POLL_S = 0.1
# Chunks read ahead of delivery per direction: a bound on what a delayed connection buffers.
_QUEUE_CHUNKS = 256


@dataclass(frozen=True)
class Delay:
    """Which hosts' traffic is delayed and how; no hosts: none."""

    hosts: frozenset[str] = frozenset()
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    seed: int = 0

    def applies(self, *addresses: str) -> bool:
        return any(address in self.hosts for address in addresses)

    def draw_s(self, rng: random.Random) -> float:
        return max(0.0, rng.gauss(self.delay_ms, self.jitter_ms)) / 1000.0

    def to_json(self) -> str:
        return json.dumps(
            {"hosts": sorted(self.hosts), "delay_ms": self.delay_ms,
             "jitter_ms": self.jitter_ms, "seed": self.seed}
        )  # fmt: skip

    @classmethod
    def read(cls, path: Path) -> Delay:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return cls()  # no fault (or a half-written file: the next poll sees it whole)
        return cls(
            frozenset(data.get("hosts", ())),
            float(data.get("delay_ms", 0)),
            float(data.get("jitter_ms", 0)),
            int(data.get("seed", 0)),
        )


def original_destination(sock: socket.socket) -> tuple[str, int]:
    """The address a redirected connection was made to."""
    raw = sock.getsockopt(socket.SOL_IP, _SO_ORIGINAL_DST, 16)
    port, address = struct.unpack("!2xH4s8x", raw)
    return socket.inet_ntoa(address), port


class Relay:
    def __init__(self, port: int, control: Path) -> None:
        self.port = port
        self.control = control
        self.delay = Delay()
        self._connections = 0

    async def serve(self) -> None:
        server = await asyncio.start_server(self._handle, "0.0.0.0", self.port)
        async with server:
            await self._watch_control()

    async def _watch_control(self) -> None:
        while True:
            self.delay = Delay.read(self.control)
            await asyncio.sleep(_CONTROL_POLL_S)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        peer = writer.get_extra_info("peername")[0]
        try:
            target = original_destination(sock)
        except OSError:
            target = ("", self.port)  # not redirected (no NAT yet): a probe of the relay
        if target[1] == self.port:
            writer.close()  # a connection to the relay itself: nothing to relay to
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()  # the server is down: the client sees the connection close
            return
        self._connections += 1
        rng = random.Random(f"{self.delay.seed}:{target}:{self._connections}")
        endpoints = (peer, target[0])
        await asyncio.gather(
            self._pump(reader, up_writer, endpoints, rng),
            self._pump(up_reader, writer, endpoints, random.Random(rng.random())),
        )

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
        endpoints: tuple[str, str], rng: random.Random,
    ) -> None:  # fmt: skip
        """Copies one direction, each chunk held until its delivery time."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_QUEUE_CHUNKS)
        deliver = asyncio.create_task(self._deliver(queue, sink))
        due = 0.0
        try:
            while (chunk := await source.read(_CHUNK_BYTES)) and not deliver.done():
                delay = self.delay
                held = delay.draw_s(rng) if delay.applies(*endpoints) else 0.0
                due = max(due, time.monotonic() + held)  # in order within the connection
                await queue.put((due, chunk))
        except OSError:
            pass
        finally:
            if not deliver.done():  # else nobody takes from the queue: it may be full
                await queue.put((due, b""))
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await deliver

    @staticmethod
    async def _deliver(
        queue: asyncio.Queue[tuple[float, bytes]], sink: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                due, chunk = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not chunk:
                    break
                sink.write(chunk)
                await sink.drain()
        finally:
            sink.close()


class DelayRelays:
    """The harness's side: a relay on each server host, all reading one control file."""

    def __init__(self, control: Path, port: int = RELAY_PORT) -> None:
        self.control, self.port = control, port

    def start(self, host: Host, log_file: Path, timeout_s: float = 20.0) -> None:
        """Starts the relay on `host`, then redirects the host's incoming connections to it
        (in that order: no connection finds the port closed)."""
        with open(log_file, "ab") as output:
            host.popen(
                [sys.executable, "-m", "stream.sandbox.chaos.relay", "--port", str(self.port),
                 "--control", str(self.control)],
                stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while not _accepts(host.address, self.port):
            if time.monotonic() > deadline:
                raise StreamError("delay relay did not start", host=host.name, log=str(log_file))
            time.sleep(0.1)
        host.redirect_tcp(self.port)

    def delay(self, hosts: Iterable[Host], delay: Delay) -> None:
        """Delays every connection to or from `hosts` (written whole: relays poll the file)."""
        chosen = Delay(frozenset(h.address for h in hosts), delay.delay_ms, delay.jitter_ms,
                       delay.seed)  # fmt: skip
        partial = self.control.with_suffix(".partial")
        partial.write_text(chosen.to_json())
        partial.replace(self.control)

    def heal(self) -> None:
        self.control.unlink(missing_ok=True)


def _accepts(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=1).close()
        return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stream.sandbox.chaos.relay")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--control", type=Path, required=True)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(Relay(args.port, args.control).serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
