"""The sandbox's short smoke (`streamctl sandbox --demo`): add entries to every bookie through
the generated gRPC stub and read them back."""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from stream.protocol.checksum import entry_checksum
from stream.sandbox.cluster import SandboxCluster
from stream.wire import bookie_pb2 as pb

DEMO_STREAM_ID = 1
DEMO_ENTRIES = 1000


def _entry(entry_id: int) -> pb.Entry:
    payload = f"hello streamkeeper #{entry_id}".encode()
    now_ms = int(time.time() * 1000)
    return pb.Entry(
        entry_id=entry_id,
        timestamp_ms=now_ms,
        payload=payload,
        crc32c=entry_checksum(DEMO_STREAM_ID, entry_id, 0, now_ms, payload),
    )


def run_demo(cluster: SandboxCluster, console: Console) -> int:
    """Returns 0 when every bookie acknowledged and returned every entry, else 1."""
    table = Table("bookie", "added", "read back", "acked/s", "term")
    ok = True
    for bookie in cluster.bookies:
        stub = bookie.stub()
        batches = [
            pb.AddRequest(
                stream_id=DEMO_STREAM_ID,
                term=1,
                lac=start - 1,
                request_id=n,
                entries=[_entry(i) for i in range(start, min(start + 100, DEMO_ENTRIES))],
            )
            for n, start in enumerate(range(0, DEMO_ENTRIES, 100))
        ]
        started = time.monotonic()
        responses = list(stub.Add(iter(batches), timeout=30))
        elapsed = time.monotonic() - started
        acked = sum(code == pb.OK for r in responses for code in r.codes)
        read_back = 0
        for response in stub.ReadRange(
            pb.ReadRangeRequest(
                stream_id=DEMO_STREAM_ID, first_entry_id=0, last_entry_id=DEMO_ENTRIES - 1
            ),
            timeout=30,
        ):
            for entry in response.entries:
                read_back += entry.payload == _entry(entry.entry_id).payload
        state = stub.StreamState(pb.StreamStateRequest(stream_id=DEMO_STREAM_ID), timeout=5)
        ok &= acked == DEMO_ENTRIES and read_back == DEMO_ENTRIES
        table.add_row(
            bookie.bookie_id, str(acked), str(read_back), f"{acked / elapsed:,.0f}", str(state.term)
        )
    console.print(table)
    console.print("[green]demo passed[/]" if ok else "[red]demo FAILED[/]")
    return 0 if ok else 1
