"""Age retention on real processes: closed fragments go once their last entry is `max_age`
old while the writer's open fragment stays; once the writer is gone, the retention service
takes the idle stream over so that its last data fragment closes and goes too
(apache/pulsar#9057), and repeated rounds over the idle stream add nothing to its metadata."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stream.client import RetentionPolicy, StreamClient
from stream.errors import EntryTrimmedError
from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.zookeeper import ZooKeeperServer
from tests.integration.retention_support import cluster_maker, wait_until

pytestmark = pytest.mark.integration

MAX_AGE_S = 2.0


@pytest.fixture
def retention_cluster(
    zookeeper: ZooKeeperServer, tmp_path: Path
) -> Iterator[Callable[..., SandboxCluster]]:
    with cluster_maker(zookeeper, tmp_path) as make:
        yield make


def rounds_logged(cluster: SandboxCluster) -> int:
    assert cluster.retention is not None
    return cluster.retention.log_text().count('"retention.round"')


def test_age_retention_then_the_idle_stream_is_closed_and_emptied(
    retention_cluster: Callable[..., SandboxCluster],
) -> None:
    cluster = retention_cluster(gc_interval_ms=500)
    with StreamClient.connect(cluster.metadata) as client:
        client.create_stream(
            "aging",
            fragment_max_entries=10,
            retention=RetentionPolicy(max_age_s=MAX_AGE_S),
        )
        writer = client.open_writer("aging")
        # Every entry is stamped after this (same host, same clock as the service).
        appending_from = time.time()
        for i in range(35):  # fragments [0-9] [10-19] [20-29] closed, [30..) open
            writer.append_async(b"old-%d" % i)
        writer.flush()

        # While the writer lives, its closed fragments go by age and its open one stays.
        info = wait_until(
            lambda: (i := client.stream_info("aging")).first_entry_id == 30 and i,
            what="the closed fragments to age out",
        )
        assert time.time() - appending_from >= MAX_AGE_S - 0.01, "deleted before max_age"
        assert [f.first_entry_id for f in info.fragments] == [30]
        assert info.term == 1 and info.writer is not None
        assert writer.append(b"still-writing") == 35
        with pytest.raises(EntryTrimmedError):
            list(client.open_reader("aging").read(0, 35))
        writer.close()

        # Idle: the retention service takes over (term 2, truncate no-op at 36), closes the
        # data fragment at the no-op and, once its last entry is max_age old, deletes it.
        info = wait_until(
            lambda: (i := client.stream_info("aging")).first_entry_id > 35 and i,
            what="the idle stream's last data fragment to go",
        )
        assert info.term == 2
        assert info.first_entry_id == 37
        assert [(f.first_entry_id, f.last_entry_id) for f in info.fragments] == [(37, None)]
        assert info.writer is None
        with pytest.raises(EntryTrimmedError) as trimmed:
            list(client.open_reader("aging").read(35, 35))
        assert trimmed.value.context["first_entry_id"] == 37

        # The fresh fragment holds nothing: later rounds, even once it is older than max_age,
        # neither take the stream over again nor add fragments.
        created_at = time.monotonic()
        seen = rounds_logged(cluster)
        wait_until(
            lambda: (
                time.monotonic() - created_at > MAX_AGE_S + 1 and rounds_logged(cluster) >= seen + 6
            ),
            what="rounds over the idle stream",
        )
        again = client.stream_info("aging")
        assert (again.term, again.first_entry_id) == (2, 37)
        assert [(f.first_entry_id, f.last_entry_id) for f in again.fragments] == [(37, None)]

        # The stream stays usable: a new writer continues after its own no-op.
        with client.open_writer("aging") as writer:
            assert writer.append(b"new") == 38
        assert [e.payload for e in client.open_reader("aging").read(37, 38)] == [b"new"]
