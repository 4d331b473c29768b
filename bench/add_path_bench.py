"""The bookie's Add path below gRPC: CPU per batch of `BookieCore.start_add` and `finish_add`.

Drives one `BookieCore` over a real `StreamStorage` (journal on: fsync before the answer) in
this process, on an asyncio loop as the gRPC service does, with a window of batches in flight,
and prints the CPU per batch of the event-loop thread and of the whole process (journal and
flusher threads included). Batches are small, as a paced writer sends them on an idle
machine, so the per-batch and per-wake-up costs show. Compare two trees by running it with
each on PYTHONPATH, in turn.

    .venv/bin/python bench/add_path_bench.py [--entries-per-batch 4] [--batches 4000]
        [--window 8] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from pathlib import Path

from stream.bookie.config import BookieConfig
from stream.bookie.core import BookieCore, StartReport
from stream.bookie.storage import StreamStorage
from stream.bookie.storage.scanned import parse_add
from stream.protocol.checksum import entry_checksum
from stream.wire import bookie_pb2 as pb

_STREAM = 7


def _batches(count: int, per_batch: int, size: int) -> list[bytes]:
    """Returns `count` serialized AddRequests of `per_batch` entries each, ids consecutive."""
    payload = b"x" * size
    out = []
    entry_id = 0
    for n in range(count):
        request = pb.AddRequest(stream_id=_STREAM, term=1, lac=entry_id - 1, request_id=n + 1)
        for _ in range(per_batch):
            entry = request.entries.add(entry_id=entry_id, timestamp_ms=1, payload=payload)
            entry.crc32c = entry_checksum(_STREAM, entry_id, 0, 1, payload)
            entry_id += 1
        out.append(request.SerializeToString())
    return out


async def _run(data_dir: Path, batches: list[bytes], window: int) -> tuple[float, float]:
    """Returns (loop-thread CPU s, process CPU s) for adding `batches`."""
    config = BookieConfig(
        listen="127.0.0.1:1", metadata="127.0.0.1:2181/bench", bookie_id="b", data_dir=str(data_dir)
    )
    storage = StreamStorage(config)
    storage.open()
    core = BookieCore(config, storage, instance_id="bench", start_report=StartReport(False, 0, 0))
    in_flight = []
    thread0, process0 = time.thread_time(), time.process_time()
    for raw in batches:
        # As the gRPC service reads a batch: scanned where it can be, else parsed.
        in_flight.append(await core.start_add(parse_add(raw, config.max_entry_bytes), raw))
        if len(in_flight) >= window:
            response = await core.finish_add(in_flight.pop(0))
            assert list(response.codes) == [pb.OK] * len(response.codes), response.message
    for item in in_flight:
        await core.finish_add(item)
    thread1, process1 = time.thread_time(), time.process_time()
    storage.close()
    return thread1 - thread0, process1 - process0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries-per-batch", type=int, default=4)
    parser.add_argument("--batches", type=int, default=4000)
    parser.add_argument("--window", type=int, default=8, help="batches in flight")
    parser.add_argument("--size", type=int, default=1024, help="payload bytes")
    parser.add_argument("--dir", default=None, help="where data goes (default: the temp dir)")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    batches = _batches(args.batches, args.entries_per_batch, args.size)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        loop_s, process_s = asyncio.run(_run(Path(tmp), batches, args.window))
    n = len(batches)
    print(
        f"{args.entries_per_batch} entries/batch, window {args.window}: CPU us per batch: "
        f"event loop {loop_s / n * 1e6:.1f}, process {process_s / n * 1e6:.1f} "
        f"({process_s / n / args.entries_per_batch * 1e6:.2f} per entry)"
    )


if __name__ == "__main__":
    main()
