"""Size retention on real processes (ZooKeeper, three bookies, `streamctl retention run`):
metadata keeps at most `max_bytes` plus one fragment, the bookies' disks really shrink, readers
of retained entries are unaffected, readers below get `EntryTrimmedError`, and a bookie that
was down during the trim drops the data once it is back."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from stream.bookie.reconcile import TRIM_ALL
from stream.client import RetentionPolicy, StreamClient
from stream.errors import EntryTrimmedError
from stream.metadata import MetadataSession, StreamStore
from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.zookeeper import ZooKeeperServer
from stream.wire import bookie_pb2 as pb
from tests.integration.retention_support import (
    MIB,
    SMALL_BOOKIE_SETTINGS,
    cluster_maker,
    data_dirs,
    logged_events,
    payload,
    wait_until,
)

pytestmark = pytest.mark.integration

ENTRY_BYTES = 64 << 10
BOOKIES = ("bookie-1", "bookie-2", "bookie-3")


@pytest.fixture
def retention_cluster(
    zookeeper: ZooKeeperServer, tmp_path: Path
) -> Iterator[Callable[..., SandboxCluster]]:
    with cluster_maker(zookeeper, tmp_path) as make:
        yield make


def append_all(client: StreamClient, name: str, count: int) -> None:
    with client.open_writer(name) as writer:
        futures = [writer.append_async(payload(i, ENTRY_BYTES)) for i in range(count)]
        writer.flush()
    assert [f.result() for f in futures] == list(range(count))


def compacted(log_path: Path) -> bool:
    """Returns whether a bookie's log shows a compaction round that rewrote a log."""
    return any(e["compacted_logs"] > 0 for e in logged_events(log_path, "compaction.done"))


def closed_bytes(cluster: SandboxCluster, name: str) -> tuple[int, int, int]:
    """Returns (first retained entry, fragment znodes, recorded bytes of the closed ones)."""
    with MetadataSession.connect(cluster.metadata) as session:
        store = StreamStore(session)
        meta, _ = store.get_stream(name)
        meta, _, fragments = store.get_snapshot(meta.id)
    return meta.first_entry_id, len(fragments), sum(f.bytes or 0 for f in fragments[:-1])


def test_size_retention_returns_the_disk_space_and_keeps_retained_entries_readable(
    retention_cluster: Callable[..., SandboxCluster],
) -> None:
    cluster = retention_cluster(**SMALL_BOOKIE_SETTINGS)
    count = 800  # 50 MiB
    with StreamClient.connect(cluster.metadata) as client:
        client.create_stream(
            "big", ensemble=3, write_quorum=3, ack_quorum=2, fragment_max_bytes=MIB
        )
        append_all(client, "big", count)
        assert len(client.stream_info("big").fragments) >= 50
        # Two tails that fall behind: each takes one entry and then waits (its prefetch stops
        # after a few chunks), while retention moves past them.
        raising = client.open_reader("big").tail("earliest", timeout_s=60)
        skipping = client.open_reader("big").tail("earliest", timeout_s=3, on_trimmed="skip")
        assert next(raising).entry_id == 0
        assert next(skipping).entry_id == 0

        wait_until(
            lambda: all(data_dirs(cluster, b)["ledgers"] >= 50 * MIB for b in BOOKIES),
            what="the entries flushed to entry logs",
        )
        before = {b: data_dirs(cluster, b) for b in BOOKIES}

        client.set_retention("big", RetentionPolicy(max_bytes=5 * MIB))
        first, znodes, kept = wait_until(
            lambda: (r := closed_bytes(cluster, "big"))[0] > 0 and r, what="the trim"
        )
        # Metadata: at most 5 MiB of closed fragments, plus the open last one.
        assert kept <= 5 * MIB
        retained = (count - first) * ENTRY_BYTES
        assert retained <= 5 * MIB + MIB + ENTRY_BYTES
        assert znodes <= 7

        # Disk: each bookie holds about what is retained once GC deleted the dead entry logs
        # and compaction rewrote the one whose only live entry is the first retained one. The
        # rest: the index, and the journal's current file and two spares kept for reuse (4 MiB
        # here, plus the group that passed the limit), however much was written.
        def shrunk() -> dict[str, dict[str, int]] | None:
            now = {b: data_dirs(cluster, b) for b in BOOKIES}
            ok = all(
                d["ledgers"] <= retained + MIB
                and d["ledgers"] + d["index"] <= retained + 3 * MIB
                and d["journal"] <= 3 * 5 * MIB
                for d in now.values()
            )
            return now if ok else None

        after = wait_until(shrunk, timeout_s=45, what="the bookies' disks to shrink")
        print("\nretained entries", count - first, "bytes", retained)
        for b in BOOKIES:
            print(b, "before", before[b], "after", after[b])
            assert (after[b]["ledgers"] + after[b]["index"]) * 4 < (
                before[b]["ledgers"] + before[b]["index"]
            )
            # Compaction rewrote a sparse log (GC or compaction deleted the dead ones); its log
            # line comes right after the old log's deletion.
            log_path = cluster.bookie(b).log_path
            wait_until(partial(compacted, log_path), timeout_s=10, what=f"{b}'s compaction")

        # Readers of retained entries are unaffected (compaction moved them: same bytes).
        reader = client.open_reader("big")
        got = [(e.entry_id, e.payload) for e in reader.read(first, count - 1)]
        assert got == [(i, payload(i, ENTRY_BYTES)) for i in range(first, count)]
        with pytest.raises(EntryTrimmedError) as below:
            list(reader.read(0, 10))
        assert below.value.context["first_entry_id"] == first

        # The tail that fell behind: EntryTrimmedError naming the first retained entry...
        seen = [0]
        with pytest.raises(EntryTrimmedError) as behind:
            for entry in raising:
                seen.append(entry.entry_id)
        assert behind.value.context["first_entry_id"] == first
        assert seen == list(range(len(seen))) and len(seen) < first
        # ...or, asked to skip, it jumps to the first retained entry and reads on.
        ids = [0] + [e.entry_id for e in skipping]
        assert ids[-(count - first) :] == list(range(first, count))
        assert first not in ids[: -(count - first)] and len(ids) < count
        assert ids == sorted(set(ids))


def test_a_bookie_down_during_the_trim_drops_the_data_once_back(
    retention_cluster: Callable[..., SandboxCluster],
) -> None:
    cluster = retention_cluster(**SMALL_BOOKIE_SETTINGS)
    count = 192  # 12 MiB
    down = cluster.bookie("bookie-3")
    with StreamClient.connect(cluster.metadata) as client:
        meta = client.create_stream(
            "missed", ensemble=3, write_quorum=3, ack_quorum=2, fragment_max_bytes=MIB
        )
        append_all(client, "missed", count)
        doomed = client.create_stream("doomed", ensemble=3, write_quorum=3, ack_quorum=2)
        append_all(client, "doomed", 32)  # 2 MiB
        wait_until(lambda: data_dirs(cluster, "bookie-3")["ledgers"] >= 14 * MIB, what="the flush")
        down.terminate()
        client.delete_stream("doomed")  # its Trim cannot reach bookie-3 either

        client.set_retention("missed", RetentionPolicy(max_bytes=2 * MIB))
        first = wait_until(lambda: client.stream_info("missed").first_entry_id, what="the trim")
        wait_until(
            lambda: "retention.trim_not_delivered" in cluster.retention.log_text(),  # type: ignore[union-attr]
            what="the service to fail to reach bookie-3",
        )
        retained = (count - first) * ENTRY_BYTES
        # The live bookies let go; bookie-3 still holds everything while it is down.
        wait_until(
            lambda: all(
                data_dirs(cluster, b)["ledgers"] <= retained + 4 * MIB
                for b in ("bookie-1", "bookie-2")
            ),
            what="the live bookies to shrink",
        )
        assert data_dirs(cluster, "bookie-3")["ledgers"] >= 12 * MIB

        down.start()
        down.wait_ready()

        def first_on_bookie_3(stream_id: int) -> int | None:
            state = down.stub().StreamState(pb.StreamStateRequest(stream_id=stream_id), timeout=5)
            return state.first_entry_id if state.code == pb.OK else None

        # Its reconciler reads the first retained entry from metadata and trims below it, and
        # trims the deleted stream away...
        wait_until(lambda: first_on_bookie_3(meta.id) == first, what="bookie-3 to trim")
        wait_until(lambda: first_on_bookie_3(doomed.id) == TRIM_ALL, what="the deleted stream")
        reconciled = logged_events(down.log_path, "reconcile.trimmed")
        assert {(e["stream_id"], e["deleted"]) for e in reconciled} == {
            (meta.id, False),
            (doomed.id, True),
        }
        # ...then its GC and compaction return the space.
        wait_until(
            lambda: data_dirs(cluster, "bookie-3")["ledgers"] <= retained + 4 * MIB,
            timeout_s=45,
            what="bookie-3's disk to shrink",
        )
        reader = client.open_reader("missed")
        got = [(e.entry_id, e.payload) for e in reader.read(first, count - 1)]
        assert got == [(i, payload(i, ENTRY_BYTES)) for i in range(first, count)]
