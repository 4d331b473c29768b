"""Storage engine benchmark: drives StreamStorage in-process like the gRPC server would.

One asyncio loop submits AddRequest batches of 100 entries (parsed from bytes, as gRPC hands
them over) with a window of batches in flight and awaits each batch's durability future.
Prints entries/s, payload MB/s, CPU time per entry and disk bytes written per payload byte
(/proc/self/io write_bytes delta, and the size of the files left) for 100 B, 1 KiB and
16 KiB entries with the journal on and off.

    .venv/bin/python bench/storage_bench.py [--seconds 3] [--repeat 3] [--dir /dev/shm]
        [--profile] [--only 1024:on]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import logging
import os
import pstats
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from stream.bookie import metrics
from stream.bookie.config import BookieConfig
from stream.bookie.storage import StreamStorage
from stream.protocol.checksum import entry_checksum
from stream.wire import bookie_pb2 as pb

BATCH_ENTRIES = 100
IN_FLIGHT_BATCHES = 64
TOO_BUSY = pb.TOO_BUSY


@dataclass
class Result:
    payload_bytes: int
    journal: bool
    entries: int
    ack_seconds: float
    total_seconds: float  # until the final flush is in entry logs and the index
    cpu_seconds: float
    io_write_bytes: int
    file_bytes: int
    too_busy: int
    syncs: int
    sync_seconds: float

    def row(self) -> str:
        payload = self.entries * self.payload_bytes
        return (
            f"{self.payload_bytes:>7} {'on' if self.journal else 'off':>7} "
            f"{self.entries / self.ack_seconds:>12,.0f} "
            f"{payload / self.ack_seconds / 1e6:>8.1f} "
            f"{self.entries / self.total_seconds:>14,.0f} "
            f"{self.cpu_seconds / self.entries * 1e6:>9.2f} "
            f"{self.io_write_bytes / payload:>9.2f} "
            f"{self.file_bytes / payload:>10.2f} "
            f"{self.too_busy:>6} "
            f"{self.syncs:>6} "
            f"{self.sync_seconds / max(self.syncs, 1) * 1e3:>7.2f} "
            f"{self.entries / max(self.syncs, 1):>7.0f}"
        )


HEADER = (
    f"{'payload':>7} {'journal':>7} {'entries/s':>12} {'MB/s':>8} "
    f"{'w/ flush e/s':>14} {'cpu us/e':>9} {'io w/B':>9} {'files w/B':>10} {'busy':>6} "
    f"{'syncs':>6} {'sync ms':>7} {'e/sync':>7}"
)


def _journal_syncs() -> tuple[int, float]:
    """Returns (journal group commits, seconds spent in them) so far in this process."""
    count = total = 0.0
    for sample in metrics.JOURNAL_SYNC_SECONDS.collect()[0].samples:
        if sample.name.endswith("_count"):
            count = sample.value
        elif sample.name.endswith("_sum"):
            total = sample.value
    return int(count), total


def _io_write_bytes() -> int:
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _dir_bytes(path: Path) -> int:
    """Returns the allocated bytes under `path` (st_blocks: LMDB's map file is sparse)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def build_batches(stream_id: int, payload_bytes: int, count: int) -> list[bytes]:
    """Returns `count` serialized AddRequests of BATCH_ENTRIES entries each."""
    payload = os.urandom(payload_bytes)
    batches = []
    entry_id = 0
    for _ in range(count):
        request = pb.AddRequest(stream_id=stream_id, term=1, lac=entry_id - 1, lafr=-1)
        for _ in range(BATCH_ENTRIES):
            request.entries.add(
                entry_id=entry_id,
                timestamp_ms=1_700_000_000_000,
                payload=payload,
                crc32c=entry_checksum(stream_id, entry_id, 0, 1_700_000_000_000, payload),
            )
            entry_id += 1
        batches.append(request.SerializeToString())
    return batches


async def drive(storage: StreamStorage, batches: list[bytes]) -> tuple[float, int]:
    """Submits every batch with IN_FLIGHT_BATCHES in flight; returns (seconds until the
    last acknowledgment, TOO_BUSY answers)."""
    loop = asyncio.get_running_loop()
    window = asyncio.Semaphore(IN_FLIGHT_BATCHES)
    too_busy = 0
    pending: set[asyncio.Future[None]] = set()

    def release(_: object) -> None:
        window.release()

    started = time.perf_counter()
    for raw in batches:
        await window.acquire()
        while True:
            request = pb.AddRequest.FromString(raw)
            outcome = storage.add_batch(request, raw)
            if outcome.codes[0] != TOO_BUSY:
                break
            too_busy += 1
            await asyncio.sleep(0.002)
        if outcome.durable is None:
            window.release()
            continue
        fut = asyncio.wrap_future(outcome.durable, loop=loop)
        fut.add_done_callback(release)
        pending.add(fut)
        fut.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)
    return time.perf_counter() - started, too_busy


def run_case(
    payload_bytes: int, journal: bool, seconds: float, profile: bool, base_dir: str | None
) -> Result:
    # Aim at ~`seconds` of work at a rough expected rate, bounded in memory.
    expected_entries_per_s = {100: 150_000, 1024: 110_000, 16384: 25_000}.get(payload_bytes, 50_000)
    entries = int(expected_entries_per_s * seconds)
    entries = min(entries, (1 << 30) // payload_bytes)
    batches = build_batches(7, payload_bytes, max(entries // BATCH_ENTRIES, 10))
    data_dir = Path(tempfile.mkdtemp(prefix="storage-bench-", dir=base_dir))
    config = BookieConfig(
        bookie_id="bench",
        listen="127.0.0.1:1",
        metadata="127.0.0.1:2181/bench",
        data_dir=str(data_dir),
        journal_write_data=journal,
    )
    storage = StreamStorage(config)
    storage.open()
    try:
        io_before = _io_write_bytes()
        syncs_before, sync_seconds_before = _journal_syncs()
        cpu_before = time.process_time()
        profiler = cProfile.Profile() if profile else None
        if profiler is not None:
            profiler.enable()
        started = time.perf_counter()
        ack_seconds, too_busy = asyncio.run(drive(storage, batches))
        storage.request_flush().result(timeout=120)
        total_seconds = time.perf_counter() - started
        if profiler is not None:
            profiler.disable()
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
            print(out.getvalue(), file=sys.stderr)
        cpu_seconds = time.process_time() - cpu_before
        io_written = _io_write_bytes() - io_before
        syncs, sync_seconds = _journal_syncs()
        file_bytes = _dir_bytes(data_dir)
    finally:
        storage.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    return Result(
        payload_bytes,
        journal,
        len(batches) * BATCH_ENTRIES,
        ack_seconds,
        total_seconds,
        cpu_seconds,
        io_written,
        file_bytes,
        too_busy,
        syncs - syncs_before,
        sync_seconds - sync_seconds_before,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="rough duration per case")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case; the best is shown")
    parser.add_argument(
        "--dir", default=None, help="where data goes (default: the temp dir; /dev/shm: no disk)"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the event-loop thread")
    parser.add_argument(
        "--only", default="", help="one case as PAYLOAD:on|off, e.g. 1024:on (default: all)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    cases = [(size, journal) for size in (100, 1024, 16384) for journal in (True, False)]
    if args.only:
        size, _, mode = args.only.partition(":")
        cases = [(int(size), mode != "off")]
    print(
        f"StreamStorage, one stream, batches of {BATCH_ENTRIES}, "
        f"{IN_FLIGHT_BATCHES} batches in flight, python {sys.version.split()[0]}, "
        f"data in {args.dir or tempfile.gettempdir()}"
    )
    print(HEADER)
    for size, journal in cases:
        runs = [
            run_case(size, journal, args.seconds, args.profile, args.dir)
            for _ in range(args.repeat)
        ]
        best = max(runs, key=lambda r: r.entries / r.ack_seconds)
        print(best.row(), flush=True)
    print(
        "entries/s and MB/s: until the last acknowledgment (journal on: after fdatasync). "
        "w/ flush: including the final flush to entry logs + index. io w/B: /proc/self/io "
        "write_bytes per payload byte; files w/B: allocated size of the files left. syncs, "
        "sync ms, e/sync: journal group commits, mean write+fdatasync time, entries per commit."
    )


if __name__ == "__main__":
    main()
