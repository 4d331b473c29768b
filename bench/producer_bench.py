"""Append throughput with idempotent producer ids and sequences on against off: one writer
appends `--count` entries of `--size` bytes to a fresh stream of an existing cluster, with
`--producer` as producer `bench-<uuid>` with sequences 0, 1, 2..., and prints entries/s.
Alternate the two modes in one run to compare them on a shared machine.

    python bench/producer_bench.py --metadata HOST:PORT/ROOT [--producer] [--count N]
"""

from __future__ import annotations

import argparse
import time
import uuid

from stream.client import StreamClient


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--producer", action="store_true")
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args()
    payload = b"x" * args.size
    name = f"bench-{uuid.uuid4().hex[:10]}"
    with StreamClient.connect(args.metadata) as client:
        client.create_stream(name, ensemble=3, write_quorum=3, ack_quorum=2)
        producer_id = f"bench-{uuid.uuid4().hex[:8]}" if args.producer else None
        with client.open_writer(name, producer_id=producer_id) as writer:
            started = time.perf_counter()
            append = writer.append_async
            if producer_id is None:
                for _ in range(args.count):
                    append(payload)
            else:
                for n in range(args.count):
                    append(payload, sequence=n)
            writer.flush()
            elapsed = time.perf_counter() - started
        client.delete_stream(name)
    mode = "producer" if args.producer else "plain"
    print(f"{mode}: {args.count} x {args.size} B in {elapsed:.2f} s: {args.count / elapsed:,.0f}/s")


if __name__ == "__main__":
    main()
