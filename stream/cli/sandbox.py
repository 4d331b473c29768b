"""`streamctl sandbox`: a local cluster (ZooKeeper and bookies) to try Streamkeeper out."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from rich.console import Console

from stream.cli.output import runs_until_stopped
from stream.errors import InvalidArgumentError
from stream.sandbox.cluster import SandboxCluster

# How often the sandbox looks for processes that exited.
_SUPERVISE_S = 0.5


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "sandbox",
        description="Starts ZooKeeper and N bookies on 127.0.0.1, prints the metadata "
        "connect string, and runs until interrupted (or, with --demo, runs a short "
        "append-and-read and stops).",
    )
    p.add_argument(
        "--bookies",
        type=int,
        default=4,
        help="number of bookies (default 4: with E = 3, writes go on when one fails)",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where all data and logs go (default: a temporary directory, removed at the end)",
    )
    p.add_argument("--zk-port", type=int, default=None, help="ZooKeeper port (default: free)")
    p.add_argument(
        "--zookeepers",
        type=int,
        default=1,
        help="ZooKeeper servers (default 1; 3 or 5: an ensemble on distinct ports, and the "
        "connect string names them all)",
    )
    p.add_argument(
        "--demo", action="store_true", help="run a short smoke against the cluster, then stop"
    )
    p.add_argument(
        "--retention-interval",
        default="10s",
        help="rounds of the retention service (default 10s; 'off': no service)",
    )
    p.add_argument(
        "--secure",
        action="store_true",
        help="bookies and services with mutual TLS and roles; the CA and a certificate per "
        "role go to DATA_DIR/tls",
    )
    runs_until_stopped(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    if args.zookeepers < 1 or (args.zookeepers > 1 and args.zk_port is not None):
        raise InvalidArgumentError(
            "--zookeepers must be >= 1, and an ensemble takes no --zk-port",
            zookeepers=args.zookeepers,
        )
    retention_s = None
    if args.retention_interval.strip().lower() != "off":
        from stream.retention.units import parse_duration

        retention_s = parse_duration(args.retention_interval)
    if args.data_dir is None:
        with tempfile.TemporaryDirectory(prefix="streamkeeper-sandbox-") as data_dir:
            return _run(args, Path(data_dir), console, retention_s)
    return _run(args, args.data_dir, console, retention_s)


def _run(
    args: argparse.Namespace, data_dir: Path, console: Console, retention_s: float | None
) -> int:
    cluster = SandboxCluster(
        data_dir,
        bookies=args.bookies,
        zk_port=args.zk_port,
        retention_interval_s=retention_s,
        secure=args.secure,
        metadata_auth_file=None
        if args.metadata_auth_file is None
        else Path(args.metadata_auth_file),
        zookeepers=args.zookeepers,
    )
    with console.status(f"starting ZooKeeper and {args.bookies} bookies"):
        cluster.start()
    try:
        # The connect string alone on stdout, for scripts.
        sys.stdout.write(cluster.metadata + "\n")
        sys.stdout.flush()
        kept = "" if args.data_dir is not None else " (removed when it stops)"
        console.print(f"[green]sandbox up[/]: data and logs in {data_dir}{kept}", soft_wrap=True)
        if cluster.tls is not None:
            _print_tls(cluster, console)
        if args.demo:
            from stream.sandbox.demo import run_demo

            return run_demo(cluster, console)
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        console.print("press Ctrl-C to stop")
        return _supervise(cluster, console, stop)
    finally:
        with console.status("stopping the sandbox"):
            cluster.stop()


def _print_tls(cluster: SandboxCluster, console: Console) -> None:
    """Tells how to reach the secure sandbox: the environment of a writer's streamctl (the
    other roles' certificates sit beside it; the metadata auth file is the cluster's
    identity)."""
    from stream.security.roles import Role

    assert cluster.tls is not None
    files = cluster.tls.client(Role.WRITER)
    console.print(
        f"TLS with roles: certificates in {cluster.tls.directory} (reader, writer, service, "
        "admin). As a writer:\n"
        f"  export STREAMKEEPER_TLS_CA_FILE={files.ca_file} "
        f"STREAMKEEPER_TLS_CERT_FILE={files.cert_file} "
        f"STREAMKEEPER_TLS_KEY_FILE={files.key_file}"
        f" STREAMKEEPER_METADATA_AUTH_FILE={cluster.metadata_auth_file}",
        soft_wrap=True,
    )


def _supervise(cluster: SandboxCluster, console: Console, stop: threading.Event) -> int:
    """Runs until `stop`, reporting at once each process that exits on its own; nothing is
    restarted. Without ZooKeeper (a majority of an ensemble) nothing works: the sandbox stops
    with exit code 1."""
    reported: set[str] = set()
    while not stop.wait(_SUPERVISE_S):
        for gone in cluster.exited():
            if gone.name in reported:
                continue
            reported.add(gone.name)
            console.print(
                f"[red]{gone.name} exited[/] (code {gone.returncode}), not restarted: "
                f"see {gone.log}",
                soft_wrap=True,
            )
            if gone.name.startswith("ZooKeeper") and not cluster.zookeeper_quorum():
                return 1
    return 0
