"""One bookie, one writer: add throughput and disk bytes written per payload byte.

Starts a real ZooKeeper and, for each journal mode (`journal_write_data` on/off) and entry
size, a fresh bookie process (`streamctl bookie start`). One client streams pre-built,
pre-serialized batches on one Add stream with a window of batches in flight (so the client
costs next to nothing), and measures entries/s and MB/s until the last acknowledgement. Disk
bytes are the bookie's `write_bytes` delta from /proc/<pid>/io, read after the write cache had
time to flush to entry logs; CPU is the bookie's user+system time.

    .venv/bin/python bench/bookie_bench.py                # every size, journal on and off
    .venv/bin/python bench/bookie_bench.py --sizes 1024 --journal on --profile /tmp/prof
"""

from __future__ import annotations

import argparse
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from rich.console import Console
from rich.table import Table

from stream.protocol.checksum import entry_checksum
from stream.sandbox.bookies import CHANNEL_OPTIONS, BookieProcess
from stream.sandbox.processes import cpu_seconds, write_bytes
from stream.sandbox.zookeeper import ZooKeeperServer
from stream.wire import bookie_pb2 as pb

FLUSH_INTERVAL_MS = 1000
DEFAULT_ENTRIES = {100: 1_000_000, 1024: 400_000, 16384: 30_000}


@dataclass
class Result:
    journal: bool
    size: int
    entries: int
    seconds: float
    disk_bytes: int
    cpu_s: float
    batches: int
    busy: int  # batches answered TOO_BUSY (and sent again)

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.entries * self.size / self.seconds / 1e6

    @property
    def disk_per_payload(self) -> float:
        return self.disk_bytes / (self.entries * self.size)


def build_batches(stream_id: int, size: int, entries: int, batch: int) -> dict[int, bytes]:
    """Returns the serialized AddRequests carrying `entries` entries of `size` bytes, by
    request id."""
    payload = (b"streamkeeper-" * (size // 13 + 1))[:size]
    timestamp_ms = int(time.time() * 1000)
    requests = {}
    for first in range(0, entries, batch):
        last = min(first + batch, entries)
        request = pb.AddRequest(
            stream_id=stream_id, term=1, lac=first - 1, lafr=first - 1, request_id=first
        )
        request.entries.extend(
            pb.Entry(
                entry_id=i,
                timestamp_ms=timestamp_ms,
                payload=payload,
                crc32c=entry_checksum(stream_id, i, 0, timestamp_ms, payload),
            )
            for i in range(first, last)
        )
        requests[first] = request.SerializeToString()
    return requests


def stream_adds(channel: grpc.Channel, batches: dict[int, bytes], window: int) -> tuple[int, int]:
    """Sends `batches` (request_id -> serialized AddRequest) on one Add stream with up to
    `window` in flight, resending a batch answered TOO_BUSY (write cache full) as a writer
    would; returns (entries acknowledged, TOO_BUSY answers)."""
    slots = threading.Semaphore(window)
    queued: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    for data in batches.values():
        queued.put(data)

    def requests() -> Iterator[bytes]:
        while True:
            slots.acquire()
            data = queued.get()
            if data is None:
                return
            yield data

    call = channel.stream_stream("/streamkeeper.v1.Bookie/Add")(requests(), timeout=600)
    remaining = len(batches)
    acked = busy = 0
    for data in call:
        slots.release()
        response = pb.AddResponse.FromString(data)
        codes = set(response.codes)
        if codes == {pb.OK}:
            acked += len(response.codes)
            remaining -= 1
            if remaining == 0:
                queued.put(None)
                slots.release()
        elif codes == {pb.TOO_BUSY}:
            busy += 1
            time.sleep(0.005)  # back off a little, as a writer would, instead of spinning
            queued.put(batches[response.request_id])
        else:
            call.cancel()
            raise RuntimeError(f"add failed: {response}")
    return acked, busy


def run_one(
    zk: ZooKeeperServer,
    base: Path,
    journal: bool,
    size: int,
    entries: int,
    batch: int,
    window: int,
    profile_dir: Path | None,
    gil: bool = False,
) -> Result:
    name = f"bench-{'j' if journal else 'nj'}-{size}"
    bookie = BookieProcess(
        name,
        base / name,
        zk.connect_string(f"/{name}"),
        metrics_port=0,
        settings={
            "journal_write_data": journal,
            "flush_interval_ms": FLUSH_INTERVAL_MS,
            "log_level": "warning",
        },
    )
    batches = build_batches(1, size, entries, batch)
    try:
        bookie.start()
        bookie.wait_ready()
        channel = grpc.insecure_channel(bookie.address, options=CHANNEL_OPTIONS)
        # Warm up the connection and the server's code paths on another stream.
        stream_adds(channel, build_batches(2, size, batch * 4, batch), window)
        time.sleep(FLUSH_INTERVAL_MS / 1000 * 1.5)
        profiler = None
        if profile_dir is not None:
            profile_dir.mkdir(parents=True, exist_ok=True)
            out = profile_dir / f"{name}.txt"
            profiler = subprocess.Popen(
                [
                    shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "--pid",
                    str(bookie.pid),
                    "--format",
                    "raw",
                    "--threads",
                    *(["--gil"] if gil else []),
                    "--nonblocking",
                    "-o",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)
        written_before = write_bytes(bookie.pid)
        cpu_before = cpu_seconds(bookie.pid)
        started = time.perf_counter()
        acked, busy = stream_adds(channel, batches, window)
        seconds = time.perf_counter() - started
        cpu_s = cpu_seconds(bookie.pid) - cpu_before
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(30)
        # Let the write cache reach the entry logs and the index before counting bytes.
        time.sleep(FLUSH_INTERVAL_MS / 1000 * 2.5)
        disk_bytes = write_bytes(bookie.pid) - written_before
        if acked != entries:
            raise RuntimeError(f"{acked} of {entries} acknowledged")
        channel.close()
        return Result(journal, size, entries, seconds, disk_bytes, cpu_s, len(batches), busy)
    finally:
        bookie.close()
        shutil.rmtree(base / name, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1024,16384", help="entry sizes in bytes")
    parser.add_argument("--journal", default="on,off", help="on, off or on,off")
    parser.add_argument("--batch", type=int, default=500, help="entries per AddRequest")
    parser.add_argument("--window", type=int, default=8, help="batches in flight")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the entry counts")
    parser.add_argument("--profile", type=Path, help="py-spy raw profiles of each run go here")
    parser.add_argument(
        "--profile-gil",
        action="store_true",
        help="profile only the thread holding the GIL (slows the bookie; shows where the "
        "one Python core goes)",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = [m.strip() == "on" for m in args.journal.split(",")]

    console = Console(width=140)
    results = []
    with tempfile.TemporaryDirectory(prefix="bookie-bench-") as tmp:
        base = Path(tmp)
        with ZooKeeperServer(base / "zk") as zk:
            for journal in modes:
                for size in sizes:
                    entries = int(DEFAULT_ENTRIES.get(size, 200_000) * args.scale)
                    entries -= entries % args.batch
                    console.print(
                        f"journal {'on' if journal else 'off'}, {size} B x {entries:,} entries..."
                    )
                    results.append(
                        run_one(
                            zk,
                            base,
                            journal,
                            size,
                            entries,
                            args.batch,
                            args.window,
                            args.profile,
                            args.profile_gil,
                        )
                    )

    table = Table(
        title=f"one bookie, one Add stream, {args.batch} entries/batch, window {args.window}"
    )
    for column in (
        "journal",
        "entry",
        "entries",
        "entries/s",
        "MB/s",
        "disk B / payload B",
        "bookie CPU µs/entry",
        "TOO_BUSY",
    ):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            "on" if r.journal else "off",
            f"{r.size} B",
            f"{r.entries:,}",
            f"{r.entries_per_s:,.0f}",
            f"{r.mb_per_s:,.1f}",
            f"{r.disk_per_payload:.2f}",
            f"{r.cpu_s / r.entries * 1e6:.1f}",
            str(r.busy),
        )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
