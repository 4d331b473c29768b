"""BP-46 figures, through the real client against three bookie processes (E3 W3 A2):

1. appends/s and disk bytes written per payload byte, with the journal holding entries
   (`journal_write_data = true`) and without (`false`), in the same run;
2. the time phase two takes to repair a bookie that lost 10^5 entries: the bookies run without
   the journal and never flush, so `kill -9` of one loses everything it acknowledged; it
   restarts, phase one puts the stream in limbo, and phase two takes the stream over and copies
   the entries back from its peers.

Disk bytes are the bookies' `write_bytes` from /proc/<pid>/io (journal, entry logs and LMDB
index), read after the write cache had time to flush; "per payload byte" divides by the
payload each bookie stores (every entry reaches all three).

    .venv/bin/python bench/bp46_bench.py
    .venv/bin/python bench/bp46_bench.py --size 100 --seconds 10 --lost 100000 --json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from stream.client import StreamClient
from stream.logs import configure_logging
from stream.sandbox.bookies import BookieProcess
from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.processes import write_bytes
from stream.sandbox.zookeeper import ZooKeeperServer
from stream.wire import bookie_pb2 as pb

FLUSH_INTERVAL_MS = 1000
# Appends in flight from the benchmark thread (the writer's own window bounds it too).
IN_FLIGHT = 4096


@dataclass
class AppendResult:
    """One append run."""

    journal: bool
    size: int
    entries: int
    seconds: float
    disk_bytes: int

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.seconds

    @property
    def disk_per_payload(self) -> float:
        return self.disk_bytes / (self.entries * self.size * 3)


@dataclass
class RepairResult:
    """One repair run: entries lost, the process start to serving, phase one, phase two (the
    bookie's own figures), and wall time from the restart to limbo cleared."""

    lost: int
    size: int
    copied: int
    took_over: bool
    serving_s: float
    phase_one_s: float
    phase_two_s: float
    restart_to_repaired_s: float

    @property
    def entries_per_s(self) -> float:
        return self.copied / self.phase_two_s if self.phase_two_s else 0.0


def log_events(bookie: BookieProcess, since_line: int = 0) -> list[dict[str, Any]]:
    """Returns the bookie's JSON log events from line `since_line` on."""
    events = []
    for line in bookie.log_path.read_text().splitlines()[since_line:]:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def append_for(
    client: StreamClient, name: str, size: int, seconds: float, max_entries: int
) -> tuple[int, float]:
    """Appends `size`-byte entries for `seconds` (at most `max_entries`); returns (entries
    acknowledged, seconds until the last acknowledgement)."""
    payload = (b"streamkeeper-bp46-" * (size // 18 + 1))[:size]
    pending: list[concurrent.futures.Future[int]] = []
    with client.open_writer(name) as writer:
        started = time.perf_counter()
        count = 0
        while time.perf_counter() - started < seconds and count < max_entries:
            pending.append(writer.append_async(payload))
            count += 1
            if len(pending) >= IN_FLIGHT:
                pending[0].result()
                pending = [f for f in pending if not f.done()]
        writer.flush()
        elapsed = time.perf_counter() - started
    return count, elapsed


def run_appends(zk: ZooKeeperServer, base: Path, journal: bool, size: int, seconds: float):
    name = f"append-{'journal' if journal else 'no-journal'}"
    cluster = SandboxCluster(
        base / name,
        bookies=3,
        root=f"/{name}",
        zookeeper=zk,
        bookie_settings={
            "journal_write_data": journal,
            "flush_interval_ms": FLUSH_INTERVAL_MS,
            "log_level": "warning",
        },
    )
    cluster.start()
    try:
        with StreamClient.connect(cluster.metadata) as client:
            client.create_stream(name, ensemble=3, write_quorum=3, ack_quorum=2)
            # Warm-up: connections, code paths, the first fragment.
            append_for(client, name, size, 0.5, 2_000)
            time.sleep(FLUSH_INTERVAL_MS / 1000 * 1.5)
            before = {b.pid: write_bytes(b.pid) for b in cluster.bookies}
            entries, elapsed = append_for(client, name, size, seconds, 10_000_000)
            # Let the write caches flush to entry logs and the index.
            time.sleep(FLUSH_INTERVAL_MS / 1000 * 2.5)
            disk = sum(write_bytes(pid) - b for pid, b in before.items())
    finally:
        cluster.stop()
    return AppendResult(journal, size, entries, elapsed, disk)


def run_repair(zk: ZooKeeperServer, base: Path, lost: int, size: int) -> RepairResult:
    cluster = SandboxCluster(
        base / "repair",
        bookies=3,
        root="/repair",
        zookeeper=zk,
        bookie_settings={
            "journal_write_data": False,
            "flush_interval_ms": 3_600_000,  # nothing reaches the entry logs: a kill loses all
            "write_cache_max_bytes": max(1 << 30, lost * (size + 256) * 2),
            "log_level": "info",
        },
    )
    cluster.start()
    try:
        with StreamClient.connect(cluster.metadata) as client:
            client.create_stream("repair", ensemble=3, write_quorum=3, ack_quorum=2)
            appended, _ = append_for(client, "repair", size, 3600.0, lost)
            stream_id = client.stream_info("repair").stream_id
        victim = cluster.bookies[2]
        victim.kill9()
        lines = len(victim.log_path.read_text().splitlines())
        started = time.perf_counter()
        victim.start()
        victim.wait_ready(120)
        request = pb.StreamStateRequest(stream_id=stream_id)
        while True:
            state = victim.stub().StreamState(request, timeout=10)
            if state.code == pb.OK and not state.limbo:
                break
            if time.perf_counter() - started > 600:
                raise RuntimeError("the repair did not finish within 10 minutes")
            time.sleep(0.01)
        repaired = time.perf_counter() - started
        events = {str(e.get("event")): e for e in log_events(victim, lines)}
        done: dict[str, Any] = events["integrity.repair_done"]
        serving: dict[str, Any] = events["bookie.serving"]
        phase_one: dict[str, Any] = events["integrity.phase_one_done"]
        # Everything is back on the victim.
        held = 0
        first = 0
        while first < appended:
            ranged = pb.ReadRangeRequest(
                stream_id=stream_id, first_entry_id=first, last_entry_id=appended - 1
            )
            got = sum(len(r.entries) for r in victim.stub().ReadRange(ranged, timeout=120))
            if got == 0:
                break
            held += got
            first += got
        if held < appended:
            raise RuntimeError(f"the victim holds {held} of {appended} entries after repair")
        return RepairResult(
            lost=appended,
            size=size,
            copied=int(done["copied"]),
            took_over=bool(done["took_over"]),
            serving_s=float(serving["start_s"]),
            phase_one_s=float(phase_one["seconds"]),
            phase_two_s=float(done["seconds"]),
            restart_to_repaired_s=repaired,
        )
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024, help="entry size, bytes (1024)")
    parser.add_argument("--seconds", type=float, default=8.0, help="appending time per mode")
    parser.add_argument("--lost", type=int, default=100_000, help="entries the victim loses")
    parser.add_argument("--repair-size", type=int, default=1024, help="their size, bytes")
    parser.add_argument("--skip-appends", action="store_true")
    parser.add_argument("--skip-repair", action="store_true")
    parser.add_argument("--json", action="store_true", help="print JSON lines too")
    args = parser.parse_args()
    configure_logging(json=False, level="warning")
    console = Console(width=150)
    base = Path(tempfile.mkdtemp(prefix="bp46-bench-"))
    zk = ZooKeeperServer(base / "zookeeper")
    zk.start()
    try:
        if not args.skip_appends:
            results = [run_appends(zk, base, j, args.size, args.seconds) for j in (True, False)]
            table = Table(title=f"appends, E3 W3 A2, {args.size} B entries, 3 bookies")
            for column in ("journal_write_data", "entries", "appends/s", "disk B / payload B"):
                table.add_column(column, justify="right")
            for r in results:
                table.add_row(
                    str(r.journal).lower(),
                    str(r.entries),
                    f"{r.entries_per_s:,.0f}",
                    f"{r.disk_per_payload:.2f}",
                )
            console.print(table)
            if args.json:
                for r in results:
                    print(json.dumps({"kind": "append", **asdict(r)}))
        if not args.skip_repair:
            r = run_repair(zk, base, args.lost, args.repair_size)
            table = Table(title="phase two: repair of a bookie that lost every entry (kill -9)")
            for column in (
                "entries lost",
                "copied",
                "takeover",
                "start to serving s",
                "phase one s",
                "phase two s",
                "entries/s",
                "restart to repaired s",
            ):
                table.add_column(column, justify="right")
            table.add_row(
                str(r.lost),
                str(r.copied),
                str(r.took_over).lower(),
                f"{r.serving_s:.2f}",
                f"{r.phase_one_s:.3f}",
                f"{r.phase_two_s:.2f}",
                f"{r.entries_per_s:,.0f}",
                f"{r.restart_to_repaired_s:.2f}",
            )
            console.print(table)
            if args.json:
                print(json.dumps({"kind": "repair", **asdict(r)}))
    finally:
        zk.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
