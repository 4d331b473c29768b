"""Takeover time against history length, and after a writer died with a full in-flight window.

Starts a sandbox (ZooKeeper and three bookie processes) and, for each history length, creates a
stream (E = WQ = 3, AQ = 2 unless `--quorum`; 100 B entries; fragments of 100k entries) and
appends the history through the client's fast path (`append_async`, no callbacks), then closes
the writer. Then:

- **idle**: `open_writer` (a takeover: new term, fence, recovery reads, truncate no-op, CAS)
  timed `--repeats` times on the closed stream; the median is shown.
- **full window**: a writer SUBPROCESS takes the stream over and appends flat out; once it
  streams, one bookie is frozen (SIGSTOP), so that no entry reaches its whole write set any
  more and the writer's window of unreplicated entries fills (acknowledgements continue at
  AQ = 2 < WQ); once its appends block the writer is killed (SIGKILL) and the bookie resumed
  (SIGCONT). The takeover that follows must read and write back the whole window.

Before each measurement the bench waits for the bookies to be idle (their write cache of the
history flushed), so that a takeover is not timed against a background flush.

Each takeover shows its wall time and, in parentheses, the CPU time this process (the client)
and the bookie processes spent meanwhile, a figure less sensitive to what else the machine
runs. The recovery's own figures (entries read in bulk, per-entry reads) come from its
structlog events, captured in this process.

    .venv/bin/python bench/takeover_bench.py                       # 10^3, 10^5, 10^6
    .venv/bin/python bench/takeover_bench.py --histories 1000,10000 --repeats 5
    .venv/bin/python bench/takeover_bench.py --histories 1000 --quorum e3w2a2   # striped
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from rich.console import Console
from rich.table import Table

from stream.client import StreamClient
from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.processes import cpu_seconds, write_bytes

ENTRY_BYTES = 100
FRAGMENT_MAX_ENTRIES = 100_000
# The bookies count as idle after this long with no disk writes and under this share of one
# CPU (all of them together).
QUIET_S = 1.0
QUIET_CPU_SHARE = 0.1
# Entries the writer subprocess gets acknowledged before a bookie is frozen.
STEADY_ENTRIES = 3000
# The writer's appends must stand still this long to count as stalled (its window is full).
STALL_S = 0.5

_CHILD = r"""
import sys, threading, time
from stream.client import StreamClient
from stream.logs import configure_logging
configure_logging(json=True, level="warning")
client = StreamClient.connect(sys.argv[1])
writer = client.open_writer(sys.argv[2])
appended = 0
def report():
    while True:
        print(writer.last_add_confirmed, appended, flush=True)
        time.sleep(0.01)
threading.Thread(target=report, daemon=True).start()
payload = b"w" * int(sys.argv[3])
while True:
    writer.append_async(payload)
    appended += 1
"""

# Recovery events captured from structlog (this process's takeovers).
_events: list[dict[str, Any]] = []


def _capture(_: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    if event.get("event") in ("recovery.fenced", "recovery.read", "recovery.done"):
        _events.append(dict(event))
    if method in ("debug", "info"):
        raise structlog.DropEvent
    return event


def configure_capture() -> None:
    """Logs warnings and errors to stderr and keeps the recovery's info events in `_events`."""
    structlog.configure(
        processors=[structlog.processors.add_log_level, _capture, structlog.dev.ConsoleRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


@dataclass
class Takeover:
    seconds: float
    # CPU seconds spent during it by this process (the client) and by the bookie processes:
    # less sensitive than wall time to what else the machine runs.
    cpu_s: float
    start_entry_id: int
    end_entry_id: int
    bulk_entries: int
    single_reads: int

    @property
    def read(self) -> int:
        """Entries the recovery recovered (read and wrote back)."""
        return self.end_entry_id - self.start_entry_id - 1


@dataclass
class Row:
    history: int
    fragments: int
    append_s: float
    idle: list[Takeover]
    window: Takeover | None
    window_unacked: int  # recovered entries the dead writer had not seen acknowledged


def cluster_cpu_s(cluster: SandboxCluster) -> float:
    """Returns the CPU seconds used so far by this process and every bookie process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime + sum(cpu_seconds(b.pid) for b in cluster.bookies)


def quiesce(cluster: SandboxCluster, console: Console, timeout_s: float = 120.0) -> float:
    """Waits until the bookies are idle (little CPU, no disk writes for a while: the history's
    write cache is flushed) and returns the seconds waited, so that a takeover is not timed
    against the bookies' background flush of what was just appended."""
    started = time.monotonic()
    pids = [b.pid for b in cluster.bookies]

    def sample() -> tuple[float, int]:
        return sum(cpu_seconds(p) for p in pids), sum(write_bytes(p) for p in pids)

    cpu, written = sample()
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < QUIET_S:
        if time.monotonic() - started > timeout_s:
            console.log("bookies still busy: measuring anyway")
            break
        time.sleep(0.25)
        cpu_now, written_now = sample()
        if cpu_now - cpu > 0.25 * QUIET_CPU_SHARE or written_now != written:
            quiet_since = time.monotonic()
        cpu, written = cpu_now, written_now
    return time.monotonic() - started


def timed_takeover(client: StreamClient, cluster: SandboxCluster, name: str) -> Takeover:
    """Returns the figures of one takeover of `name` (the writer is closed right after)."""
    _events.clear()
    cpu_before = cluster_cpu_s(cluster)
    started = time.perf_counter()
    writer = client.open_writer(name)
    seconds = time.perf_counter() - started
    cpu_s = cluster_cpu_s(cluster) - cpu_before
    writer.close()
    fenced = next((e for e in _events if e["event"] == "recovery.fenced"), None)
    done = next((e for e in _events if e["event"] == "recovery.done"), None)
    read = next((e for e in _events if e["event"] == "recovery.read"), {})
    if fenced is None or done is None:  # a stream never written: nothing to read
        return Takeover(seconds, cpu_s, -1, 0, 0, 0)
    return Takeover(
        seconds,
        cpu_s,
        fenced["start_entry_id"],
        done["last_entry_id"],
        read.get("bulk_entries", 0),
        read.get("single_reads", 0),
    )


def append_history(client: StreamClient, name: str, count: int) -> float:
    """Appends `count` entries of ENTRY_BYTES and returns the seconds it took."""
    payload = b"h" * ENTRY_BYTES
    started = time.perf_counter()
    with client.open_writer(name) as writer:
        for _ in range(count):
            writer.append_async(payload)
        writer.flush()
    return time.perf_counter() - started


class _LacWatcher:
    """Follows the `LAC APPENDED` lines a writer subprocess prints."""

    def __init__(self, child: subprocess.Popen[str]) -> None:
        self.lac = -1
        self.appended = 0
        self.changed_at = time.monotonic()  # when `appended` last moved
        self._thread = threading.Thread(target=self._run, args=(child,), daemon=True)
        self._thread.start()

    def _run(self, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lac, appended = (int(x) for x in line.split())
            self.lac = lac
            if appended != self.appended:
                self.appended, self.changed_at = appended, time.monotonic()


def abandon_with_full_window(
    cluster: SandboxCluster, name: str, deadline_s: float = 60.0
) -> tuple[int, int]:
    """Leaves `name` abandoned by a killed writer whose window of unreplicated entries is full;
    returns (the writer's last LAC, the entries it appended before it stalled)."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, cluster.metadata, name, str(ENTRY_BYTES)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    frozen = cluster.bookies[-1]
    stopped = False
    try:
        watcher = _LacWatcher(child)
        deadline = time.monotonic() + deadline_s
        while watcher.lac < 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if watcher.lac < 0:
            raise RuntimeError("the writer subprocess never took over")
        first_lac = watcher.lac
        # Freeze the bookie once the writer streams (a few thousand entries acknowledged).
        while watcher.lac < first_lac + STEADY_ENTRIES:
            if time.monotonic() > deadline:
                raise RuntimeError("the writer subprocess does not append")
            time.sleep(0.01)
        os.kill(frozen.pid, signal.SIGSTOP)
        stopped = True
        # Appends block once the window is full (with AQ < WQ the LAC moves until then).
        while time.monotonic() - watcher.changed_at < STALL_S:
            if time.monotonic() > deadline:
                raise RuntimeError("the writer's appends never stalled")
            time.sleep(0.02)
        lac = watcher.lac
        child.kill()
        child.wait(timeout=30)
        return lac, lac - first_lac
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
        if stopped:
            os.kill(frozen.pid, signal.SIGCONT)


def run(args: argparse.Namespace, data_dir: Path, console: Console) -> list[Row]:
    rows = []
    with SandboxCluster(data_dir, bookies=args.bookies) as cluster:
        client = StreamClient.connect(cluster.metadata)
        try:
            for history in args.histories:
                name = f"history-{history}"
                client.create_stream(
                    name,
                    ensemble=args.quorum[0],
                    write_quorum=args.quorum[1],
                    ack_quorum=args.quorum[2],
                    fragment_max_entries=FRAGMENT_MAX_ENTRIES,
                )
                append_s = append_history(client, name, history)
                console.log(f"{name}: appended in {append_s:.1f} s")
                waited_s = quiesce(cluster, console)
                console.log(f"{name}: bookies idle after {waited_s:.1f} s")
                idle = [timed_takeover(client, cluster, name) for _ in range(args.repeats)]
                window = None
                unacked = 0
                if not args.no_window:
                    lac, _ = abandon_with_full_window(cluster, name)
                    quiesce(cluster, console)
                    window = timed_takeover(client, cluster, name)
                    unacked = window.end_entry_id - 1 - lac
                fragments = len(client.stream_info(name).fragments)
                rows.append(Row(history, fragments, append_s, idle, window, unacked))
                console.log(f"{name}: measured")
        finally:
            client.close()
    return rows


def print_table(rows: list[Row], args: argparse.Namespace, console: Console) -> None:
    e, wq, aq = args.quorum
    table = Table(
        title=f"takeover time (E={e} WQ={wq} AQ={aq}, {ENTRY_BYTES} B entries, "
        f"{args.bookies} bookie processes)"
    )
    for column in (
        "history",
        "fragments",
        "append rate",
        f"idle takeover, median of {args.repeats} (CPU)",
        "idle: entries read",
        "full window: takeover (CPU)",
        "entries recovered (bulk / per-entry reads)",
        "unacked at kill",
    ):
        table.add_column(column, justify="right")
    for row in rows:
        median = statistics.median(t.seconds for t in row.idle)
        median_cpu = statistics.median(t.cpu_s for t in row.idle)
        window = row.window
        table.add_row(
            f"{row.history:,}",
            str(row.fragments),
            f"{row.history / row.append_s:,.0f}/s",
            f"{median * 1000:.0f} ms ({median_cpu * 1000:.0f} ms)",
            str(max(t.read for t in row.idle)),
            "-"
            if window is None
            else f"{window.seconds * 1000:.0f} ms ({window.cpu_s * 1000:.0f} ms)",
            "-"
            if window is None
            else f"{window.read:,} ({window.bulk_entries:,} / {window.single_reads})",
            "-" if window is None else f"{row.window_unacked:,}",
        )
    console.print(table)


def parse_quorum(text: str) -> tuple[int, int, int]:
    """Returns (E, WQ, AQ) from `eEwWaA`, e.g. `e3w2a2`."""
    match = re.fullmatch(r"e(\d+)w(\d+)a(\d+)", text)
    if match is None:
        raise argparse.ArgumentTypeError("quorum must look like e3w3a2")
    e, wq, aq = (int(g) for g in match.groups())
    return e, wq, aq


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--histories",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1_000, 100_000, 1_000_000],
        help="history lengths, comma-separated (default 1000,100000,1000000)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="idle takeovers per history")
    parser.add_argument(
        "--quorum",
        type=parse_quorum,
        default=(3, 3, 2),
        help="eEwWaA (default e3w3a2; with E > WQ recovery reads go per entry)",
    )
    parser.add_argument("--bookies", type=int, default=3, help="sandbox bookies (default 3)")
    parser.add_argument("--no-window", action="store_true", help="skip the full-window case")
    parser.add_argument("--data-dir", default=None, help="sandbox directory (default: tmp)")
    args = parser.parse_args()
    configure_capture()
    console = Console(width=160)
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="takeover-bench-"))
    try:
        rows = run(args, data_dir, console)
    finally:
        if args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    print_table(rows, args, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
