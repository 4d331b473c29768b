"""The client on real ZooKeeper and bookie processes: appends read back identical (plain and
striped ensembles), capacity rolls crossed by readers, tail latency, argument checks, and the
trimmed / not-written distinction."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator

import pytest

from stream.client import StreamClient
from stream.errors import (
    EntryNotWrittenError,
    EntryTrimmedError,
    InvalidArgumentError,
    StreamNotFoundError,
)
from stream.sandbox.cluster import SandboxCluster
from tests.integration.conftest import ClusterFactory

pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]


def payload(i: int) -> bytes:
    """Returns a distinct, checkable payload of 60-120 bytes for entry number `i`."""
    head = f"entry-{i}:".encode()
    return head * (60 // len(head) + 1 + i % 5)


@pytest.fixture
def client(cluster: SandboxCluster) -> Iterator[StreamClient]:
    c = StreamClient.connect(cluster.metadata)
    try:
        yield c
    finally:
        c.close()


def append_and_read_back(client: StreamClient, name: str, count: int) -> None:
    with client.open_writer(name) as writer:
        futures = [writer.append_async(payload(i)) for i in range(count)]
        writer.flush()
        ids = [f.result() for f in futures]
    assert ids == list(range(count))
    reader = client.open_reader(name)
    got = list(reader.read(0, count - 1))
    assert [e.entry_id for e in got] == ids
    assert all(e.payload == payload(i) for i, e in enumerate(got))
    assert all(e.stream == name for e in got)


def test_e3w3a2_50k_entries_read_back_identical(client: StreamClient) -> None:
    client.create_stream("plain", ensemble=3, write_quorum=3, ack_quorum=2)
    append_and_read_back(client, "plain", 50_000)
    info = client.stream_info("plain")
    assert info.lac == 49_999
    assert info.term == 1 and info.state == "OPEN"


def test_e5w3a2_striped_50k_entries_read_back_identical(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(5)
    with StreamClient.connect(cluster.metadata) as client:
        client.create_stream("striped", ensemble=5, write_quorum=3, ack_quorum=2)
        append_and_read_back(client, "striped", 50_000)
        info = client.stream_info("striped")
        assert len(info.fragments[-1].ensemble) == 5


def test_capacity_rolls_fragments_in_metadata_and_reader_crosses_them(
    client: StreamClient,
) -> None:
    client.create_stream("rolling", fragment_max_entries=1000)
    count = 5_500
    tailed: list[int] = []

    def tail() -> None:
        tail_reader = client.open_reader("rolling")
        for entry in tail_reader.tail("earliest", timeout_s=3.0):
            tailed.append(entry.entry_id)
            if entry.entry_id == count - 1:
                return

    tailer = threading.Thread(target=tail)
    tailer.start()
    with client.open_writer("rolling") as writer:
        for i in range(count):
            writer.append_async(payload(i))
        writer.flush()
    tailer.join(timeout=60)
    assert not tailer.is_alive()
    info = client.stream_info("rolling")
    bounds = [(f.first_entry_id, f.last_entry_id) for f in info.fragments]
    assert bounds == [(i, i + 999) for i in range(0, 5000, 1000)] + [(5000, None)]
    for fragment in info.fragments[:-1]:
        assert fragment.bytes is not None and fragment.bytes >= 1000 * 60
        assert len(set(fragment.ensemble)) == 3
    got = list(client.open_reader("rolling").read(0, count - 1))
    assert [e.entry_id for e in got] == list(range(count))
    assert all(e.payload == payload(e.entry_id) for e in got)
    assert tailed == list(range(count))


def test_tail_sees_an_entry_within_50ms_of_its_acknowledgment(client: StreamClient) -> None:
    client.create_stream("latency")
    seen: dict[int, float] = {}
    ready = threading.Event()

    def tail() -> None:
        reader = client.open_reader("latency")
        ready.set()
        for entry in reader.tail("earliest", timeout_s=5.0):
            seen[entry.entry_id] = time.monotonic()
            if entry.entry_id >= 59:
                return

    tailer = threading.Thread(target=tail)
    with client.open_writer("latency") as writer:
        tailer.start()
        assert ready.wait(10)
        acked: dict[int, float] = {}
        for i in range(60):
            entry_id = writer.append(payload(i))
            acked[entry_id] = time.monotonic()
            # Idle between appends: the LAC must reach readers without a following add.
            time.sleep(0.02 if i % 2 else 0.2)
        tailer.join(timeout=30)
    assert sorted(seen) == list(range(60))
    delays_ms = [(seen[i] - acked[i]) * 1000 for i in range(60)]
    assert statistics.median(delays_ms) < 50, delays_ms
    # Also when the writer went idle right after: the even-numbered entries.
    assert statistics.median(delays_ms[0::2]) < 50, delays_ms


def test_nonsense_is_refused_before_anything_is_written(client: StreamClient) -> None:
    bad = [
        dict(name="a/b"),
        dict(name=""),
        dict(name="ok", ensemble=2, write_quorum=3, ack_quorum=2),
        dict(name="ok", ensemble=3, write_quorum=3, ack_quorum=0),
        dict(name="ok", fragment_max_entries=0),
        dict(name="ok", fragment_max_bytes=-1),
    ]
    before = client.list_streams()
    for kwargs in bad:
        name = kwargs.pop("name")
        with pytest.raises(InvalidArgumentError):
            client.create_stream(name, **kwargs)
    assert client.list_streams() == before
    with pytest.raises(StreamNotFoundError):
        client.open_writer("missing")
    client.create_stream("typed")
    with client.open_writer("typed") as writer, pytest.raises(InvalidArgumentError):
        writer.append("text, not bytes")  # type: ignore[arg-type]


def test_trimmed_entries_and_unwritten_entries_raise_distinct_errors(
    client: StreamClient,
) -> None:
    client.create_stream("trimmed", fragment_max_entries=100)
    with client.open_writer("trimmed") as writer:
        for i in range(350):
            writer.append_async(payload(i))
        writer.flush()
    assert client.trim("trimmed", before_entry_id=250) == 200
    info = client.stream_info("trimmed")
    assert info.first_entry_id == 200
    assert info.fragments[0].first_entry_id == 200
    reader = client.open_reader("trimmed")
    with pytest.raises(EntryTrimmedError) as trimmed:
        list(reader.read(150, 260))
    assert trimmed.value.context["first_entry_id"] == 200
    with pytest.raises(EntryNotWrittenError):
        list(reader.read(300, 400))
    assert [e.entry_id for e in reader.read(200, 349)] == list(range(200, 350))
    assert [e.entry_id for e in reader.tail("earliest", timeout_s=0.2)][:1] == [200]
