"""Format compatibility: a stream written in the entry format from before attributes existed
reads back identically, on real bookies.

The old writer's adds are rebuilt here byte for byte, apart from the client's encoder: the Entry
fields 1-5 encoded by hand and the checksum computed from its definition (crc32c over the
>QqIq header, then the payload), pinned against bytes the old client produced. They go to the
bookies as raw adds through the gRPC stubs; then a takeover recovers that tail (recovery reads
and write-backs verify the old checksums) and readers (bulk reads, single reads, tail) return
the entries with no key and no headers. Robust where a data directory fixture is not: it does
not depend on the bookie's on-disk layout of one day, and the wire bytes it pins are what every
stored entry of that format holds."""

from __future__ import annotations

import struct

import crc32c
import pytest

from stream.client import StreamClient
from stream.framing.encoding import varint as _varint
from stream.sandbox.cluster import SandboxCluster
from stream.wire import bookie_pb2 as pb
from tests.integration.bookie_support import add_all

pytestmark = pytest.mark.integration

BASE_MS = 1_700_000_000_000


def old_entry(
    stream_id: int, entry_id: int, flags: int, timestamp_ms: int, payload: bytes
) -> bytes:
    """An Entry as the client before attributes framed it (field 7 of an AddRequest)."""
    crc = crc32c.crc32c(struct.pack(">QqIq", stream_id, entry_id, flags, timestamp_ms) + payload)
    body = b"".join(
        (
            b"\x08" + _varint(entry_id),
            b"\x10" + _varint(flags) if flags else b"",
            b"\x18" + _varint(timestamp_ms),
            b"\x22" + _varint(len(payload)) + payload,
            b"\x28" + _varint(crc),
        )
    )
    return b"\x3a" + _varint(len(body)) + body


def test_the_rebuilt_old_encoding_is_what_the_old_client_produced() -> None:
    # Hex printed by the client's prepare_entry before attributes existed.
    assert old_entry(123456789, 300, 0, BASE_MS + 300, b"legacy-300").hex() == (
        "3a1c08ac0218acd295ffbc31220a6c65676163792d333030288fd5c2b707"
    )
    assert old_entry(123456789, 1, 1, BASE_MS + 1, b"").hex() == (
        "3a13080110011881d095ffbc3122002888e6decb0f"
    )


def test_a_stream_in_the_old_format_reads_back_identically(
    client: StreamClient, cluster: SandboxCluster
) -> None:
    count = 1_000
    client.create_stream("legacy", ensemble=3, write_quorum=3, ack_quorum=2)
    writer = client.open_writer("legacy")  # term 1, nothing appended
    writer.abort()
    writer.close()
    info = client.stream_info("legacy")
    stream_id, term = info.stream_id, info.term
    payloads = [b"legacy-%d" % i * (1 + i % 7) for i in range(count)]
    # Entry 500 is a no-op, as a takeover of the old code left them: readers skip it.
    flags = [1 if i == 500 else 0 for i in range(count)]
    entries = [
        old_entry(stream_id, i, flags[i], BASE_MS + i, b"" if flags[i] else payloads[i])
        for i in range(count)
    ]
    requests = []
    for start in range(0, count, 100):
        header = pb.AddRequest(stream_id=stream_id, term=term, lac=start - 1, lafr=start - 1)
        raw = header.SerializeToString() + b"".join(entries[start : start + 100])
        requests.append(pb.AddRequest.FromString(raw))
    for bookie_id in info.fragments[-1].ensemble:
        responses = add_all(cluster.bookie(bookie_id).stub(), requests)
        assert all(code == pb.OK for r in responses for code in r.codes), bookie_id

    # The next writer's takeover recovers the old tail (reads, checksums, write-backs).
    with client.open_writer("legacy") as successor:
        assert successor.term == term + 1
        after = successor.append(b"after")
    assert after == count + 1  # its own no-op at `count` ends the old term

    expected = [(i, payloads[i], BASE_MS + i, None, ()) for i in range(count) if not flags[i]]
    reader = client.open_reader("legacy")
    got = [
        (e.entry_id, e.payload, e.timestamp_ms, e.key, e.headers) for e in reader.read(0, count - 1)
    ]
    assert got == expected
    tailed = list(reader.tail(0, timeout_s=1))
    assert [(e.entry_id, e.payload, e.key, e.headers) for e in tailed[:-1]] == [
        (i, p, None, ()) for i, p, _, _, _ in expected
    ]
    assert tailed[-1].payload == b"after"
    columns = [c for c in reader.read_columns(0, count - 1)]
    assert all(not c.attributes for c in columns)
    assert [i for c in columns for i in c.ids] == [e[0] for e in expected]
