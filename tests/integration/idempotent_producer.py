"""A producer for the idempotent-producer crash test, run as its own process (and killed with
SIGKILL): opens the stream as producer PRODUCER_ID and appends records 0..TOTAL-1 with
sequence = record number, from the start every time it runs. It writes `last L` (the writer's
`last_sequence` after its takeover) and then, per record, `ack N ID` once acknowledged
(`sync`: one append at a time) or `sent N` once queued (`async`: appends in flight, acks
awaited at the end), each line flushed before the next append.

    python -m tests.integration.idempotent_producer METADATA STREAM PRODUCER_ID TOTAL OUT MODE
"""

from __future__ import annotations

import sys

from stream.client import StreamClient


def main(metadata: str, stream: str, producer_id: str, total: str, out_path: str, mode: str) -> int:
    with (
        StreamClient.connect(metadata) as client,
        open(out_path, "a") as out,
        client.open_writer(stream, producer_id=producer_id) as writer,
    ):
        out.write(f"last {writer.last_sequence}\n")
        out.flush()
        futures = []
        for n in range(int(total)):
            payload = b"record-%d" % n
            if mode == "sync":
                entry_id = writer.append(payload, sequence=n)
                out.write(f"ack {n} {entry_id}\n")
            else:
                futures.append(writer.append_async(payload, sequence=n))
                out.write(f"sent {n}\n")
            out.flush()
        for n, future in enumerate(futures):
            # Flushed line by line: a kill between buffer-sized writes would leave a torn line
            # that the next run's first line joins.
            out.write(f"ack {n} {future.result()}\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:7]))
