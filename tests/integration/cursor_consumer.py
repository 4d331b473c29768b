"""A consumer for the cursor crash test, run as its own process (and killed with SIGKILL):
tails a stream with a durable cursor and records, one line each, the cursor's position when it
started and every entry id it processed (written and flushed before it asks for the next).

    python -m tests.integration.cursor_consumer METADATA STREAM CURSOR OUT_FILE IDLE_S
"""

from __future__ import annotations

import sys
import time

from stream.client import StreamClient


def main(metadata: str, stream: str, cursor_name: str, out_path: str, idle_s: str) -> int:
    with StreamClient.connect(metadata) as client, open(out_path, "a") as out:
        cursor = client.cursor(stream, cursor_name)
        out.write(f"start {cursor.position}\n")
        out.flush()
        reader = client.open_reader(stream)
        for entry in reader.tail(
            "earliest", timeout_s=float(idle_s), cursor=cursor, auto_commit_interval_s=0.1
        ):
            time.sleep(0.001)  # the application's work on the entry
            out.write(f"{entry.entry_id}\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
