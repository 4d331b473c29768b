"""A producer for the idempotent-producer crash test, run as its own process: opens the stream
as producer PRODUCER_ID and appends records 0..TOTAL-1 with sequence = record number, from the
start every time it runs. It writes `last L` (the writer's `last_sequence` after its takeover)
and then, per record, `ack N ID` once acknowledged (`sync`: one append at a time) or `sent N`
once queued (`async`: appends in flight, acks awaited at the end), each line flushed before the
next append.

With KILL_AT (a record number), the process kills itself with SIGKILL once record KILL_AT is
acknowledged (`sync`) or queued (`async`, after record KILL_AT // 2 is acknowledged, so that
the run leaves some records durable and, as a rule, later ones in flight). The crash point is
then the test's choice, not a race between the producer and the test's polling.

    python -m tests.integration.idempotent_producer \
        METADATA STREAM PRODUCER_ID TOTAL OUT MODE [KILL_AT]
"""

from __future__ import annotations

import os
import signal
import sys

from stream.client import StreamClient


def main(
    metadata: str,
    stream: str,
    producer_id: str,
    total: str,
    out_path: str,
    mode: str,
    kill_at: str = "-1",
) -> int:
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
            if n == int(kill_at):
                if futures:
                    futures[n // 2].result()
                os.kill(os.getpid(), signal.SIGKILL)
        for n, future in enumerate(futures):
            # Flushed line by line: a kill between buffer-sized writes would leave a torn line
            # that the next run's first line joins.
            out.write(f"ack {n} {future.result()}\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:8]))
