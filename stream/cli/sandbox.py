"""`streamctl sandbox`: a local cluster (ZooKeeper and bookies) to try Streamkeeper out."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from rich.console import Console

from stream.cli.output import runs_until_stopped
from stream.sandbox.cluster import SandboxCluster


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "sandbox",
        help="run ZooKeeper and bookies on this machine",
        description="Starts ZooKeeper and N bookies on 127.0.0.1, prints the metadata "
        "connect string, and runs until interrupted (or, with --demo, runs a short "
        "append-and-read and stops).",
    )
    p.add_argument("--bookies", type=int, default=3, help="number of bookies (default 3)")
    p.add_argument("--data-dir", type=Path, required=True, help="where all data and logs go")
    p.add_argument("--zk-port", type=int, default=None, help="ZooKeeper port (default: free)")
    p.add_argument(
        "--demo", action="store_true", help="run a short smoke against the cluster, then stop"
    )
    p.add_argument(
        "--retention-interval",
        default="10s",
        help="rounds of the retention service (default 10s; 'off': no service)",
    )
    runs_until_stopped(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    retention_s = None
    if args.retention_interval.strip().lower() != "off":
        from stream.retention.units import parse_duration

        retention_s = parse_duration(args.retention_interval)
    cluster = SandboxCluster(
        args.data_dir,
        bookies=args.bookies,
        zk_port=args.zk_port,
        retention_interval_s=retention_s,
    )
    with console.status(f"starting ZooKeeper and {args.bookies} bookies"):
        cluster.start()
    try:
        # The connect string alone on stdout, for scripts.
        sys.stdout.write(cluster.metadata + "\n")
        sys.stdout.flush()
        console.print(f"[green]sandbox up[/]: data and logs in {args.data_dir}")
        if args.demo:
            from stream.sandbox.demo import run_demo

            return run_demo(cluster, console)
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        console.print("press Ctrl-C to stop")
        stop.wait()
        return 0
    finally:
        with console.status("stopping the sandbox"):
            cluster.stop()
