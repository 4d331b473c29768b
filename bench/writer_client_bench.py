"""The writer client below gRPC: CPU per entry of a real `AsyncStreamWriter` on its loop thread
and of the thread appending to it, with bookies that answer each AddRequest OK after a delay.

One thread appends one entry at a time through `submit_threadsafe` on a fixed schedule (as
`streamctl bench paced` does: at least a millisecond between wake-ups), so the batches take the
shape they take against real bookies (a batch per bookie in flight, the linger). The fake
bookies serialize each batch (`AddBatch.to_bytes`, as the gRPC transport does) and answer with
a parsed `AddResponse`, so those costs count; gRPC's own do not. Compare two trees by running it
with each on PYTHONPATH, in turn.

    .venv/bin/python bench/writer_client_bench.py [--entries 100000] [--rate 20000]
        [--delay 0.004] [--size 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import threading
import time
from typing import Any

from stream.client.options import WriterOptions
from stream.client.ports import AddBatch
from stream.client.recovery import TakeoverResult
from stream.client.writer import AsyncStreamWriter
from stream.clock import SystemClock
from stream.metadata.model import Fragment, StreamMeta
from stream.wire import bookie_pb2 as pb

_BOOKIES = ("b1", "b2", "b3")


class _Stream:
    """One bookie's Add stream: answers every entry OK `delay_s` after the batch."""

    def __init__(self, delay_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._delay_s = delay_s

    def send(self, batch: AddBatch) -> asyncio.Future[pb.AddResponse]:
        batch.to_bytes()
        future: asyncio.Future[pb.AddResponse] = self._loop.create_future()
        ids = [e.entry_id for e in batch.entries]
        answer = pb.AddResponse(entry_ids=ids, codes=[pb.OK] * len(ids)).SerializeToString()
        self._loop.call_later(
            self._delay_s, lambda: future.set_result(pb.AddResponse.FromString(answer))
        )
        return future

    def close(self) -> None:
        pass


class _Transport:
    def __init__(self, delay_s: float) -> None:
        self._delay_s = delay_s

    def open_add_stream(self, bookie_id: str) -> _Stream:
        return _Stream(self._delay_s)


async def _open(delay_s: float) -> AsyncStreamWriter:
    """A writer on an e3w3a2 stream, installed as a takeover would leave it (no metadata)."""
    writer = AsyncStreamWriter(
        "bench",
        transport=_Transport(delay_s),  # type: ignore[arg-type]
        metadata=None,  # type: ignore[arg-type]
        clock=SystemClock(),
        rng=random.Random(1),
        options=WriterOptions(),
    )
    writer._loop = writer._drain.loop = asyncio.get_running_loop()
    writer._loop_thread = threading.get_ident()
    writer._max_entry_bytes = 1 << 20
    meta = StreamMeta(
        name="bench",
        id=7,
        ensemble=3,
        write_quorum=3,
        ack_quorum=2,
        fragment_max_entries=1 << 40,
        fragment_max_bytes=1 << 50,
        term=1,
    )
    writer._effects.install(
        TakeoverResult(
            meta=meta,
            version=1,
            term=1,
            last_fragment=Fragment(0, _BOOKIES),
            last_entry_id=-1,
            written_bytes=0,
            last_timestamp_ms=None,
        )
    )
    writer._drain.idle = True
    return writer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=20_000, help="appends/s")
    parser.add_argument("--delay", type=float, default=0.004, help="bookie answer delay (s)")
    parser.add_argument("--size", type=int, default=1024, help="payload bytes")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()

    def on_loop(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    async def loop_cpu() -> float:
        return time.thread_time()

    try:
        writer = on_loop(_open(args.delay))
        payload = bytes(range(256)) * (args.size // 256) + b"x" * (args.size % 256)
        loop0, caller0 = on_loop(loop_cpu()), time.thread_time()
        started = time.perf_counter()
        interval = 1 / args.rate
        last = None
        for count in range(args.entries):
            due = started + count * interval
            now = time.perf_counter()
            if due > now:
                time.sleep(max(due - now, 0.001))
            last = writer.submit_threadsafe(payload)
        caller1 = time.thread_time()
        assert last is not None
        last.result(30)
        on_loop(writer.flush())
        loop1 = on_loop(loop_cpu())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
    n = args.entries
    print(
        f"CPU us per entry: loop thread {(loop1 - loop0) / n * 1e6:.2f}, appending thread "
        f"{(caller1 - caller0) / n * 1e6:.2f} (its pacing included)"
    )


if __name__ == "__main__":
    main()
