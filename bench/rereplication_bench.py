"""Auto-recovery figures: fragments and MB re-replicated per second after a bookie is lost.

Five bookie processes (E3 W3 A2), each running its auditor candidate and replication
workers (`autorecovery = true`); several idle streams with many closed fragments of 1 KiB
entries. One bookie is killed with `kill -9` and stays down. Timed: from the kill to the
first marker (the lost-bookie delay plus the audit), and from the first marker to the moment
no fragment names the dead bookie and no marker is left (the copies, and the takeovers that
close the idle streams' open fragments). Entries and bytes copied are the workers' own
counts (`autorecovery.replicated` in the bookies' logs).

    .venv/bin/python bench/rereplication_bench.py
    .venv/bin/python bench/rereplication_bench.py --streams 8 --entries 50000 --workers 2 --json
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

from rich.console import Console
from rich.table import Table

from stream.client import StreamClient
from stream.logs import configure_logging
from stream.metadata import MetadataSession, StreamStore
from stream.metadata.underreplication import UnderreplicationStore
from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.zookeeper import ZooKeeperServer

DELAY_MS = 1000


@dataclass
class Result:
    streams: int
    entries_per_stream: int
    size: int
    workers_per_bookie: int
    fragments_naming_victim: int
    fragments_replicated: int
    entries_copied: int
    bytes_copied: int
    kill_to_marked_s: float
    marked_to_done_s: float

    @property
    def fragments_per_s(self) -> float:
        return self.fragments_replicated / self.marked_to_done_s

    @property
    def mb_per_s(self) -> float:
        return self.bytes_copied / 1e6 / self.marked_to_done_s


def fill(client: StreamClient, name: str, count: int, size: int) -> None:
    payload = (b"streamkeeper-rereplication-" * (size // 27 + 1))[:size]
    with client.open_writer(name) as writer:
        pending: list[concurrent.futures.Future[int]] = []
        for _ in range(count):
            pending.append(writer.append_async(payload))
            if len(pending) >= 4096:
                pending[0].result()
                pending = [f for f in pending if not f.done()]
        writer.flush()


def naming(session: MetadataSession, bookie_id: str) -> int:
    store = StreamStore(session)
    return sum(
        1
        for stream_id in store.stream_ids()
        for f in store.get_snapshot(stream_id)[2]
        if bookie_id in f.ensemble
    )


def copied_by_workers(cluster: SandboxCluster) -> tuple[int, int, int]:
    """Returns (fragments, entries, bytes) the workers logged as replicated."""
    fragments = entries = size = 0
    for bookie in cluster.bookies:
        if not bookie.log_path.exists():
            continue
        for line in bookie.log_path.read_text().splitlines():
            if '"autorecovery.replicated"' not in line:
                continue
            event = json.loads(line)
            fragments += 1
            entries += int(event.get("entries", 0))
            size += int(event.get("bytes", 0))
    return fragments, entries, size


def run(args: argparse.Namespace, zk: ZooKeeperServer, base: Path) -> Result:
    settings = {
        "autorecovery": True,
        "lost_bookie_recovery_delay_ms": DELAY_MS,
        "open_stream_replication_delay_ms": DELAY_MS,
        "replication_workers": args.workers,
    }
    cluster = SandboxCluster(base / "cluster", bookies=5, zookeeper=zk, bookie_settings=settings)
    cluster.start()
    client = StreamClient.connect(cluster.metadata)
    session = MetadataSession.connect(cluster.metadata)
    try:
        for i in range(args.streams):
            name = f"bench-{i}"
            client.create_stream(
                name,
                ensemble=3,
                write_quorum=3,
                ack_quorum=2,
                fragment_max_entries=args.fragment_entries,
            )
            fill(client, name, args.entries, args.size)
        counts = {b.bookie_id: naming(session, b.bookie_id) for b in cluster.bookies}
        victim = max(counts, key=lambda b: counts[b])
        store = UnderreplicationStore(session)
        cluster.bookie(victim).kill9()
        killed = time.monotonic()
        marked = None
        while True:
            now = time.monotonic()
            markers = store.markers()
            if marked is None and markers:
                marked = now
            if marked is not None and not markers and naming(session, victim) == 0:
                done = now
                break
            if now - killed > args.timeout:
                raise SystemExit(f"not repaired after {args.timeout}s")
            time.sleep(0.1)
        fragments, entries, size = copied_by_workers(cluster)
        return Result(
            streams=args.streams,
            entries_per_stream=args.entries,
            size=args.size,
            workers_per_bookie=args.workers,
            fragments_naming_victim=counts[victim],
            fragments_replicated=fragments,
            entries_copied=entries,
            bytes_copied=size,
            kill_to_marked_s=marked - killed,
            marked_to_done_s=done - marked,
        )
    finally:
        session.close()
        client.close()
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--entries", type=int, default=25_000, help="entries per stream")
    parser.add_argument("--size", type=int, default=1024, help="entry size, bytes (1024)")
    parser.add_argument("--fragment-entries", type=int, default=2_500)
    parser.add_argument("--workers", type=int, default=1, help="replication workers per bookie")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", action="store_true", help="print a JSON line too")
    args = parser.parse_args()
    configure_logging(json=False, level="warning")
    base = Path(tempfile.mkdtemp(prefix="rereplication-bench-"))
    zk = ZooKeeperServer(base / "zookeeper")
    zk.start()
    try:
        r = run(args, zk, base)
    finally:
        zk.stop()
        shutil.rmtree(base, ignore_errors=True)
    table = Table(title="re-replication after kill -9 of one of 5 bookies, E3 W3 A2")
    for column in (
        "fragments naming it",
        "replicated",
        "entries",
        "MB",
        "kill to marked s",
        "marked to done s",
        "fragments/s",
        "MB/s",
    ):
        table.add_column(column, justify="right")
    table.add_row(
        str(r.fragments_naming_victim),
        str(r.fragments_replicated),
        f"{r.entries_copied:,}",
        f"{r.bytes_copied / 1e6:,.1f}",
        f"{r.kill_to_marked_s:.2f}",
        f"{r.marked_to_done_s:.2f}",
        f"{r.fragments_per_s:.2f}",
        f"{r.mb_per_s:.1f}",
    )
    Console(width=150).print(table)
    if args.json:
        print(
            json.dumps({**asdict(r), "fragments_per_s": r.fragments_per_s, "mb_per_s": r.mb_per_s})
        )  # noqa: T201


if __name__ == "__main__":
    main()
