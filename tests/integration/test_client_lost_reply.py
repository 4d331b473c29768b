"""A writer whose metadata multi-op landed but whose reply was lost, on real processes: another
client's same-term change (a trim, as retention makes) lands before the writer looks again, and
the writer goes on (issue 14 item 5). The reply is dropped at the metadata seam, the
`StreamStore` under the writer's client, after the real ZooKeeper applied the multi-op."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss

from stream.client import StreamClient
from stream.sandbox.cluster import SandboxCluster

# Its tests kill no bookie and use streams of their own: one cluster for the module.
pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]

FRAGMENT_ENTRIES = 50


def payload(i: int) -> bytes:
    return f"lost-reply-{i}".encode() * 4


@pytest.fixture
def clients(cluster: SandboxCluster) -> Iterator[tuple[StreamClient, StreamClient]]:
    """A client for the writers and another one for the trims."""
    writing = StreamClient.connect(cluster.metadata)
    trimming = StreamClient.connect(cluster.metadata)
    try:
        yield writing, trimming
    finally:
        writing.close()
        trimming.close()


def lose_reply(
    client: StreamClient, which: Callable[[list[Any], int], bool], meanwhile: Callable[[], object]
) -> list[int]:
    """Makes the first multi-op of `client`'s metadata store for which `which(ops, index)`
    holds (`index` counts its multi-ops from 0) land and then raise ConnectionLoss, after
    `meanwhile` ran. Returns a list that gets one item when that happened."""
    store = client._metadata.store
    original = store._commit
    sent: list[int] = []
    lost: list[int] = []

    def commit(ops: Any) -> list[Any]:
        results = original(ops)
        sent.append(1)
        if not lost and which(list(ops), len(sent) - 1):
            lost.append(1)
            meanwhile()
            raise ConnectionLoss()
        return results

    store._commit = commit  # type: ignore[method-assign]
    return lost


def is_roll(ops: list[Any], index: int) -> bool:
    """A capacity roll: meta, the closed fragment, the new one."""
    return [op.kind for op in ops] == ["set_data", "set_data", "create"]


def test_writer_goes_on_after_a_lost_roll_reply_and_a_trim(
    clients: tuple[StreamClient, StreamClient],
) -> None:
    writing, trimming = clients
    writing.create_stream("lossy", fragment_max_entries=FRAGMENT_ENTRIES)
    # The first roll lands, its reply is lost, and the first fragment (closed by that roll) is
    # trimmed before the writer's store looks again.
    lost = lose_reply(writing, is_roll, lambda: trimming.trim("lossy", FRAGMENT_ENTRIES))
    writer = writing.open_writer("lossy")
    ids = [writer.append_async(payload(i)) for i in range(3 * FRAGMENT_ENTRIES)]
    writer.flush()
    assert lost == [1]
    assert [f.result(timeout=30) for f in ids] == list(range(3 * FRAGMENT_ENTRIES))
    assert writer.append(b"still writing", timeout_s=30) == 3 * FRAGMENT_ENTRIES
    writer.close()
    info = trimming.stream_info("lossy")
    assert info.term == 1 and info.first_entry_id == FRAGMENT_ENTRIES
    got = list(trimming.open_reader("lossy").read(FRAGMENT_ENTRIES, 3 * FRAGMENT_ENTRIES - 1))
    assert [e.payload for e in got] == [
        payload(i) for i in range(FRAGMENT_ENTRIES, 3 * FRAGMENT_ENTRIES)
    ]


def test_takeover_goes_on_after_a_lost_finish_recovery_reply_and_a_trim(
    clients: tuple[StreamClient, StreamClient], cluster: SandboxCluster
) -> None:
    writing, trimming = clients
    writing.create_stream("lossy-takeover", fragment_max_entries=FRAGMENT_ENTRIES)
    first = writing.open_writer("lossy-takeover")
    for i in range(2 * FRAGMENT_ENTRIES + 10):
        first.append_async(payload(i))
    first.flush()
    first.close()
    # A new client takes over: its multi-ops are begin_takeover (0), then finish_recovery (1),
    # whose reply is lost while the two closed fragments are trimmed.
    taking = StreamClient.connect(cluster.metadata)
    try:
        lost = lose_reply(
            taking,
            lambda ops, index: index == 1,
            lambda: trimming.trim("lossy-takeover", 2 * FRAGMENT_ENTRIES),
        )
        second = taking.open_writer("lossy-takeover")
        assert lost == [1]
        assert second.term == 2
        after = second.append(b"after the takeover", timeout_s=30)
        second.close()
    finally:
        taking.close()
    info = trimming.stream_info("lossy-takeover")
    assert info.term == 2 and info.first_entry_id == 2 * FRAGMENT_ENTRIES
    got = list(trimming.open_reader("lossy-takeover").read(2 * FRAGMENT_ENTRIES, after))
    assert [e.payload for e in got] == [
        *(payload(i) for i in range(2 * FRAGMENT_ENTRIES, 2 * FRAGMENT_ENTRIES + 10)),
        b"after the takeover",
    ]
