"""Idempotent producers on real ZooKeeper and bookie processes: a producer reopened after its
writer went away knows its last sequence, its re-sent appends are dropped and answer the ids
already written; rolls, plain takeovers and other producers keep every producer's position
in the producer table; gaps, steps back and unnumbered appends are refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stream.client import StreamClient
from stream.errors import InvalidArgumentError
from stream.protocol.producers import EPOCH_BITS, UNKNOWN_ENTRY_ID
from stream.sandbox.cluster import SandboxCluster

pytestmark = pytest.mark.integration


@pytest.fixture
def client(cluster: SandboxCluster) -> Iterator[StreamClient]:
    c = StreamClient.connect(cluster.metadata)
    try:
        yield c
    finally:
        c.close()


def payloads(client: StreamClient, name: str) -> list[bytes]:
    reader = client.open_reader(name)
    lac = client.stream_info(name).lac
    return [e.payload for e in reader.read(0, lac)] if lac >= 0 else []


def test_reopened_producer_drops_what_it_wrote(client: StreamClient) -> None:
    client.create_stream("p", ensemble=3, write_quorum=2, ack_quorum=2)
    with client.open_writer("p", producer_id="p1") as writer:
        assert writer.last_sequence == -1
        ids = [writer.append(b"r%d" % n, sequence=n) for n in range(5)]
    with client.open_writer("p", producer_id="p1") as writer:
        assert writer.last_sequence == 4
        # Re-run from the start: the first five are dropped and answer their ids.
        again = [writer.append(b"r%d" % n, sequence=n) for n in range(8)]
        assert again[:5] == ids
        assert writer.last_sequence == 7
    assert payloads(client, "p") == [b"r%d" % n for n in range(8)]


def test_refused_appends_write_nothing(client: StreamClient) -> None:
    client.create_stream("q", ensemble=3, write_quorum=3, ack_quorum=2)
    with client.open_writer("q", producer_id="p1") as writer:
        writer.append(b"a", sequence=0)
        for bad in ({"sequence": 2}, {"sequence": 0}, {}):
            with pytest.raises(InvalidArgumentError):
                writer.append(b"x", **bad)  # type: ignore[arg-type]
        writer.append(b"b", sequence=1)
        # A new epoch may start at its first position.
        writer.append(b"c", sequence=1 << EPOCH_BITS)
    with client.open_writer("q") as plain:
        with pytest.raises(InvalidArgumentError):
            plain.append(b"x", sequence=3)
        with pytest.raises(InvalidArgumentError):
            _ = plain.last_sequence
    assert payloads(client, "q") == [b"a", b"b", b"c"]


def test_positions_survive_rolls_plain_takeovers_and_other_producers(
    client: StreamClient,
) -> None:
    client.create_stream("r", ensemble=3, write_quorum=3, ack_quorum=2, fragment_max_entries=4)
    with client.open_writer("r", producer_id="a") as writer:
        for n in range(10):  # two rolls
            writer.append(b"a%d" % n, sequence=n)
    info = client.stream_info("r")
    assert len(info.fragments) >= 3
    with client.open_writer("r") as plain:  # folds "a" into the table, ends its term
        plain.append(b"plain")
    with client.open_writer("r", producer_id="b") as writer:
        assert writer.last_sequence == -1
        writer.append(b"b0", sequence=0)
    with client.open_writer("r", producer_id="a") as writer:
        assert writer.last_sequence == 9
        # The table knows the id of the last sequence only; older ones are not kept.
        assert writer.append(b"a9", sequence=9) == 9
        writer2_ids = [writer.append(b"a%d" % n, sequence=n) for n in (10, 11)]
    assert writer2_ids[0] > 9
    with client.open_writer("r", producer_id="a") as writer:
        assert writer.last_sequence == 11
        # That term was "a"'s own: its run tells older ids too; before it, not.
        assert writer.append(b"a9", sequence=9) == UNKNOWN_ENTRY_ID
        assert writer.append(b"a10", sequence=10) == writer2_ids[0]
        assert writer.append(b"a11", sequence=11) == writer2_ids[1]
    assert payloads(client, "r") == [b"a%d" % n for n in range(10)] + [b"plain", b"b0"] + [
        b"a10",
        b"a11",
    ]
