"""Bookie failures under a live writer, on real processes: `kill -9` of an ensemble member during
appends (ensemble change, nothing acknowledged lost, appends keep working), and too few bookies
left (appends fail with NotEnoughBookiesError instead of hanging)."""

from __future__ import annotations

import time

import pytest

from stream.client import StreamClient, WriterOptions
from stream.errors import NotEnoughBookiesError
from tests.integration.conftest import ClusterFactory

pytestmark = pytest.mark.integration


def payload(i: int) -> bytes:
    return f"failure-entry-{i}|".encode() * 4


def test_kill9_one_bookie_of_five_during_appends(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(5)
    with StreamClient.connect(cluster.metadata) as client:
        client.create_stream("survivor", ensemble=3, write_quorum=3, ack_quorum=2)
        count = 20_000
        with client.open_writer("survivor") as writer:
            futures = [writer.append_async(payload(i)) for i in range(2_000)]
            writer.flush()
            victim = client.stream_info("survivor").fragments[-1].ensemble[0]
            for i in range(2_000, count):
                futures.append(writer.append_async(payload(i)))
                if i == 8_000:
                    cluster.bookie(victim).kill9()
            writer.flush()
            # Every append was acknowledged: none failed, ids in order.
            assert [f.result(timeout=0) for f in futures] == list(range(count))
            # And appending keeps working on the new ensemble.
            assert writer.append(b"after the crash") == count
        info = client.stream_info("survivor")
        assert victim not in info.fragments[-1].ensemble
        assert len(info.fragments) >= 2
        assert any(victim in f.ensemble for f in info.fragments[:-1])
        got = list(client.open_reader("survivor").read(0, count))
        assert [e.entry_id for e in got] == list(range(count + 1))
        assert all(e.payload == payload(e.entry_id) for e in got[:count])
        assert got[-1].payload == b"after the crash"


def test_fewer_than_ack_quorum_bookies_fail_appends_instead_of_hanging(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(3)
    options = WriterOptions(ensemble_change_deadline_s=2.0, add_timeout_s=5.0)
    with StreamClient.connect(cluster.metadata, writer_options=options) as client:
        client.create_stream("doomed", ensemble=3, write_quorum=3, ack_quorum=2)
        writer = client.open_writer("doomed")
        try:
            for i in range(100):
                writer.append(payload(i))
            cluster.bookies[0].kill9()
            cluster.bookies[1].kill9()
            started = time.monotonic()
            with pytest.raises(NotEnoughBookiesError):
                for i in range(100, 10_000):
                    writer.append(payload(i), timeout_s=30)
            assert time.monotonic() - started < 20
            # The writer stays failed: later appends fail at once.
            with pytest.raises(NotEnoughBookiesError):
                writer.append_async(b"more").result(timeout=5)
        finally:
            writer.close()
