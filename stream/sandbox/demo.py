"""The sandbox's short append-and-tail (`streamctl sandbox --demo`), run through `streamctl`
itself: create a stream, start a tailing reader, append lines, check the reader printed them
all in order, then show the stream's info."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from rich.console import Console

from stream.sandbox.cluster import SandboxCluster
from stream.security.roles import Role

DEMO_STREAM = "demo"
DEMO_MESSAGES = [f"hello streamkeeper #{i}" for i in range(20)]


def _streamctl(cluster: SandboxCluster, *args: str, role: Role = Role.WRITER) -> list[str]:
    """Returns the streamctl command line of `args` (with `role`'s certificate in a secure
    sandbox)."""
    return [
        sys.executable,
        "-m",
        "stream.cli.main",
        *cluster.metadata_options(),
        *cluster.streamctl_options(role),
        *args,
    ]


def run_demo(cluster: SandboxCluster, console: Console, timeout_s: float = 60.0) -> int:
    """Returns 0 when the tailing reader printed every appended line in order, else 1."""
    console.rule("streamctl create")
    subprocess.run(
        _streamctl(
            cluster,
            "create",
            DEMO_STREAM,
            "--ensemble",
            "3",
            "--write-quorum",
            "3",
            "--ack-quorum",
            "2",
        ),
        check=True,
        timeout=timeout_s,
    )
    console.rule("streamctl tail (in the background) + streamctl append")
    tail = subprocess.Popen(
        _streamctl(
            cluster, "tail", DEMO_STREAM, "--from", "earliest", "--timeout", "10", role=Role.READER
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    got_all = threading.Event()

    def read_tail() -> None:
        assert tail.stdout is not None
        for line in tail.stdout:
            lines.append(line.rstrip("\n"))
            console.print(f"  tail> {lines[-1]}")
            if len(lines) >= len(DEMO_MESSAGES):
                got_all.set()

    reader = threading.Thread(target=read_tail, daemon=True)
    reader.start()
    try:
        append_args: list[str] = []
        for message in DEMO_MESSAGES:
            append_args += ["-m", message]
        started = time.monotonic()
        subprocess.run(
            _streamctl(cluster, "append", DEMO_STREAM, *append_args),
            check=True,
            timeout=timeout_s,
        )
        got_all.wait(timeout_s)
        elapsed = time.monotonic() - started
    finally:
        tail.terminate()
        tail.wait(timeout=10)
    console.rule("streamctl info")
    subprocess.run(_streamctl(cluster, "info", DEMO_STREAM), check=True, timeout=timeout_s)
    if lines[: len(DEMO_MESSAGES)] == DEMO_MESSAGES:
        console.print(
            f"[green]demo passed[/]: {len(DEMO_MESSAGES)} entries appended and tailed "
            f"in {elapsed:.2f}s"
        )
        return 0
    console.print(f"[red]demo FAILED[/]: the tail printed {lines!r}")
    return 1
