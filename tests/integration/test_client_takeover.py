"""Takeovers on real processes (docs/design.md §5 "Taking over"): two writers in turn, a writer
killed mid-batch and its stream taken over (every acknowledged entry kept, the truncate no-op
invisible), re-engaging after INVALID_TERM, and sealing."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from stream.client import StreamClient
from stream.errors import InvalidTermError
from stream.metadata import StreamSealedError
from stream.sandbox.cluster import SandboxCluster

pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]


def payload(i: int, term: str = "a") -> bytes:
    return f"{term}-takeover-{i}".encode() * 3


@pytest.fixture
def client(cluster: SandboxCluster) -> Iterator[StreamClient]:
    c = StreamClient.connect(cluster.metadata)
    try:
        yield c
    finally:
        c.close()


def test_two_writers_in_turn(client: StreamClient) -> None:
    client.create_stream("relay")
    first = client.open_writer("relay")
    for i in range(100):
        first.append_async(payload(i, "a"))
    first.flush()
    assert first.term == 1
    second = client.open_writer("relay")
    assert second.term == 2
    with pytest.raises(InvalidTermError) as fenced:
        first.append(b"too late", timeout_s=30)
    assert fenced.value.context["term"] == 1
    assert fenced.value.context["current_term"] == 2
    with pytest.raises(InvalidTermError):
        first.append(b"still too late", timeout_s=30)
    first.close()
    # The recovery ended the first term with its no-op at 100; the second term follows it.
    ids = [second.append(payload(i, "b")) for i in range(100)]
    assert ids == list(range(101, 201))
    second.close()
    got = list(client.open_reader("relay").read(0, 200))
    assert [e.entry_id for e in got] == [*range(100), *range(101, 201)]
    assert [e.payload for e in got] == [
        *(payload(i, "a") for i in range(100)),
        *(payload(i, "b") for i in range(100)),
    ]
    info = client.stream_info("relay")
    assert info.term == 2 and info.lac == 200


_CHILD = r"""
import sys
from stream.client import StreamClient
from stream.logs import configure_logging
configure_logging(json=True, level="warning")  # logs to stderr: stdout carries the ids
client = StreamClient.connect(sys.argv[1])
writer = client.open_writer("abandoned")
def report(future):
    print(future.result(), flush=True)
i = 0
while True:
    payload = f"child-{i}".encode() * 8
    writer.append_async(payload).add_done_callback(report)
    i += 1
"""


def test_stream_abandoned_mid_batch_is_taken_over_keeping_every_acknowledged_entry(
    client: StreamClient, cluster: SandboxCluster
) -> None:
    client.create_stream("abandoned")
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, cluster.metadata],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    acknowledged: list[int] = []
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 60
        while len(acknowledged) < 3_000 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            acknowledged.append(int(line))
        child.kill()  # kill -9 while appends are in flight
    finally:
        child.kill()
        child.wait(timeout=30)
    assert len(acknowledged) >= 3_000
    assert acknowledged == list(range(len(acknowledged)))
    with client.open_writer("abandoned") as writer:
        assert writer.term == 2
        next_id = writer.append(b"first of term 2")
    noop_id = next_id - 1
    assert noop_id >= len(acknowledged)
    got = list(client.open_reader("abandoned").read(0, next_id))
    # Every acknowledged entry is there unchanged; recovered entries continue without a gap;
    # the no-op is never returned.
    assert [e.entry_id for e in got] == [*range(noop_id), next_id]
    assert all(e.payload == f"child-{e.entry_id}".encode() * 8 for e in got[:-1])
    assert got[-1].payload == b"first of term 2"
    # The real `streamctl tail` shows the same entries and skips the no-op too.
    tailed = subprocess.run(
        [
            *(sys.executable, "-m", "stream.cli.main", "--metadata", cluster.metadata),
            *("tail", "abandoned", "--from", "earliest", "--timeout", "2", "--show-ids"),
        ],
        capture_output=True,
        timeout=120,
    )
    assert tailed.returncode == 0, tailed.stderr
    lines = [line.split(b"\t") for line in tailed.stdout.splitlines()]
    assert [int(line[0]) for line in lines] == [e.entry_id for e in got]
    assert [line[2] for line in lines] == [e.payload for e in got]


def test_reengage_takes_over_again_after_invalid_term(client: StreamClient) -> None:
    client.create_stream("leader")
    writer = client.open_writer("leader", reengage=True)
    try:
        writer.append(b"one")
        client.open_writer("leader").close()  # a rival takes over (term 2) and leaves
        # The append that meets the newer term fails (its fate is for the recovery to say);
        # the writer takes over again (term 3) and goes on.
        results = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                results.append(writer.append(b"again", timeout_s=30))
                break
            except InvalidTermError:
                results.append(None)
        assert results[-1] is not None
        assert writer.term == 3
        assert results.count(None) <= 1
    finally:
        writer.close()
    follower = client.open_writer("leader", reengage=True, is_leader=lambda: False)
    try:
        client.open_writer("leader").close()
        with pytest.raises(InvalidTermError):
            for _ in range(3):
                follower.append(b"not the leader", timeout_s=30)
    finally:
        follower.close()


def test_seal_stream_forbids_writers_and_keeps_entries_readable(client: StreamClient) -> None:
    client.create_stream("sealed")
    with client.open_writer("sealed") as writer:
        for i in range(50):
            writer.append_async(payload(i))
    client.seal_stream("sealed")
    assert client.stream_info("sealed").state == "SEALED"
    with pytest.raises(StreamSealedError):
        client.open_writer("sealed")
    got = list(client.open_reader("sealed").read(0, 49))
    assert [e.payload for e in got] == [payload(i) for i in range(50)]
