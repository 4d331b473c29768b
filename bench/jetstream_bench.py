"""Streamkeeper e3w3a2 appends against NATS JetStream R3, in the same run, rounds alternating.

Setup (idempotent, needs root the first time): Debian's `nats-server` and `libnats-dev` (the
NATS C client) from apt-get; bench/jetstream_pub.c is compiled against it. Then three
nats-server processes form a cluster on loopback (free ports, file storage, one core each
with GOMAXPROCS=1 unless --server-cores says otherwise) beside a Streamkeeper sandbox of three
bookie processes (journal on: fsync before acknowledgment). Each pair of rounds runs one
Streamkeeper writer (`streamctl bench append --existing`, 1 KiB, e3w3a2, full speed) and one C
publisher (a fresh R3 file stream, 1 KiB, 256 publishes in flight), in A B, B A, A B... order,
and prints each pair's ratio. Note that JetStream acknowledges before its fsync (sync_interval
defaults to two minutes); Streamkeeper's bookies fsync first.

    .venv/bin/python bench/jetstream_bench.py --rounds 5 --seconds 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from stream.logs import configure_logging
from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.ports import free_port
from stream.sandbox.processes import terminate

PUBLISHER_SOURCE = Path(__file__).with_name("jetstream_pub.c")
DEBIAN_PACKAGES = ["nats-server", "libnats-dev", "gcc", "pkg-config"]


def install() -> None:
    """Installs the Debian packages that are missing (an apt-get update first only if the
    install fails on stale lists)."""
    present = shutil.which("nats-server") and shutil.which("gcc")
    if present and subprocess.run(["pkg-config", "--exists", "libnats"]).returncode == 0:
        return
    command = ["apt-get", "install", "-y", "--no-install-recommends", *DEBIAN_PACKAGES]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(command, env=env).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, check=True)
        subprocess.run(command, env=env, check=True)


def build_publisher(directory: Path) -> Path:
    """Compiles bench/jetstream_pub.c against libnats into `directory`; returns the binary."""
    flags = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "libnats"], capture_output=True, text=True, check=True
    ).stdout.split()
    binary = directory / "jetstream_pub"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(PUBLISHER_SOURCE), *flags], check=True)
    return binary


def _wait_listening(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"nats-server exited ({process.returncode}):\n{log.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nats-server did not listen on {port} within 30 s:\n{log.read_text()}")


@contextlib.contextmanager
def jetstream_cluster(base: Path, cores: int) -> Iterator[str]:
    """Runs three clustered nats-server processes with JetStream on file storage under `base`;
    yields the first one's URL and stops each by its pid afterwards."""
    client_ports = [free_port() for _ in range(3)]
    route_ports = [free_port() for _ in range(3)]
    routes = ", ".join(f"nats://127.0.0.1:{p}" for p in route_ports)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for i, (client_port, route_port) in enumerate(zip(client_ports, route_ports, strict=True)):
            directory = base / f"nats-{i + 1}"
            (directory / "store").mkdir(parents=True)
            config = directory / "server.conf"
            config.write_text(
                f"server_name: n{i + 1}\n"
                f"listen: 127.0.0.1:{client_port}\n"
                f'jetstream {{ store_dir: "{directory / "store"}" }}\n'
                f"cluster {{ name: bench, listen: 127.0.0.1:{route_port}, routes: [{routes}] }}\n"
            )
            log = directory / "server.log"
            with open(log, "wb") as out:
                processes.append(
                    subprocess.Popen(
                        ["nats-server", "-c", str(config)],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env={**os.environ, "GOMAXPROCS": str(cores)},
                    )
                )
            _wait_listening(client_port, processes[-1], log)
        yield f"nats://127.0.0.1:{client_ports[0]}"
    finally:
        for process in processes:
            terminate(process, 10.0)


def jetstream_round(publisher: Path, url: str, seconds: float, size: int, in_flight: int) -> float:
    """Returns the acknowledged messages/s of one C publisher round (a fresh stream)."""
    name = f"bench{time.monotonic_ns()}"
    done = subprocess.run(
        [str(publisher), url, name, str(seconds), str(size), str(in_flight)],
        capture_output=True,
        text=True,
        timeout=seconds + 180,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the JetStream publisher failed: {done.stderr}")
    figures = json.loads(done.stdout)
    if figures["failed"]:
        raise RuntimeError(f"JetStream refused publishes: {figures}")
    return float(figures["acked"]) / float(figures["seconds"])


def streamkeeper_round(metadata: str, seconds: float, size: int) -> float:
    """Returns the appends/s of one `streamctl bench append` run (a fresh stream, one writer,
    e3w3a2, full speed), in a process of its own like the C publisher."""
    done = subprocess.run(
        [
            sys.executable, "-m", "stream.cli.main", "--metadata", metadata,
            "bench", "append", "--existing", "--json", "--sizes", str(size),
            "--writers", "1", "--quorums", "e3w3a2", "--seconds", str(seconds),
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 180,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"streamctl bench append failed: {done.stderr}")
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("{")]
    return float(json.loads(line)["entries_per_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="pairs of rounds (5)")
    parser.add_argument("--seconds", type=float, default=10.0, help="each round (10)")
    parser.add_argument("--size", type=int, default=1024, help="bytes per entry/message (1024)")
    parser.add_argument("--in-flight", type=int, default=256, help="JetStream publishes (256)")
    parser.add_argument("--server-cores", type=int, default=1, help="GOMAXPROCS of each server")
    parser.add_argument("--json", action="store_true", help="print JSON lines too")
    args = parser.parse_args()
    if args.rounds < 1 or args.seconds <= 0 or args.size < 1 or args.in_flight < 1:
        parser.error("--rounds, --seconds, --size and --in-flight must be positive")
    configure_logging(json=False, level="warning")
    install()
    console = Console(width=150)
    base = Path(tempfile.mkdtemp(prefix="jetstream-bench-"))
    pairs: list[dict[str, float]] = []
    try:
        publisher = build_publisher(base)
        sandbox = SandboxCluster(
            base / "streamkeeper", bookies=3, bookie_settings={"log_level": "warning"}
        )
        with sandbox, jetstream_cluster(base, args.server_cores) as url:
            load = os.getloadavg()[0]
            for n in range(args.rounds):
                rates: dict[str, float] = {}
                # A B, B A, ...: neither system always runs first (after the other's flush).
                for system in ("streamkeeper", "jetstream")[:: 1 if n % 2 == 0 else -1]:
                    rates[system] = (
                        streamkeeper_round(sandbox.metadata, args.seconds, args.size)
                        if system == "streamkeeper"
                        else jetstream_round(
                            publisher, url, args.seconds, args.size, args.in_flight
                        )
                    )
                ratio = rates["streamkeeper"] / rates["jetstream"]
                pair = {"round": n + 1, **{k: round(v) for k, v in rates.items()}}
                pair["ratio"] = round(ratio, 3)
                pairs.append(pair)
                console.print(f"  {pair}", highlight=False)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    console.print(
        f"{args.size} B, one writer: Streamkeeper e3w3a2 (journal on) / JetStream R3 (file, C "
        f"client, {args.in_flight} in flight); load average {load:.1f} at the start",
        highlight=False,
    )
    table = Table(title="appends/s, rounds alternating")
    for column in ("round", "Streamkeeper/s", "JetStream/s", "ratio"):
        table.add_column(column, justify="right")
    for p in pairs:
        table.add_row(
            str(p["round"]),
            f"{p['streamkeeper']:,.0f}",
            f"{p['jetstream']:,.0f}",
            f"{p['ratio']:.2f}",
        )
    table.add_row("median", "", "", f"{statistics.median(p['ratio'] for p in pairs):.2f}")
    console.print(table)
    if args.json:
        for p in pairs:
            print(json.dumps(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
