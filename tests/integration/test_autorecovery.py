"""Auto-recovery on real processes (docs/design.md §7): a bookie killed for good is re-replicated
away by the bookies' own auditor and workers; workers never share a marker and a killed
worker's marker goes to another; a live bookie is drained with nobody noticing."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from stream.autorecovery.settings import AutoRecoverySettings
from stream.autorecovery.worker import ReplicationWorker
from stream.client import StreamClient
from stream.client.grpc_transport import GrpcTransport
from stream.client.zk_metadata import ZkMetadata
from stream.metadata import MetadataSession, StreamStore
from stream.metadata.underreplication import LockInfo, Marker, UnderreplicationStore
from stream.sandbox.cluster import SandboxCluster
from stream.wire import bookie_pb2 as pb
from tests.integration.cli_support import streamctl
from tests.integration.conftest import ClusterFactory
from tests.integration.replication_support import assert_three_live_copies, session_of

pytestmark = pytest.mark.integration

FAST = {
    "autorecovery": True,
    "lost_bookie_recovery_delay_ms": 2000,
    "open_stream_replication_delay_ms": 2000,
}


def payload(name: str, i: int) -> bytes:
    return f"{name}:{i}:".encode() * 20


def fill(client: StreamClient, name: str, count: int) -> list[bytes]:
    with client.open_writer(name) as writer:
        futures = [writer.append_async(payload(name, i)) for i in range(count)]
        writer.flush()
        for f in futures:
            f.result()
    return [payload(name, i) for i in range(count)]


def fragments_of(session: MetadataSession, name: str) -> list[Any]:
    store = StreamStore(session)
    meta, _ = store.get_stream(name)
    return store.get_fragments(meta.id)


def naming(session: MetadataSession, names: list[str], bookie_id: str) -> int:
    return sum(1 for name in names for f in fragments_of(session, name) if bookie_id in f.ensemble)


def metric(bookie: Any, name: str) -> float:
    """Returns the value of an unlabelled metric on `bookie`'s Prometheus endpoint."""
    import urllib.request

    with urllib.request.urlopen(f"http://{bookie.metrics_address}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no metric {name} on {bookie.bookie_id}")


def wait_for(check: Any, timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.25)
    return time.monotonic() - started


def read_all(client: StreamClient, name: str) -> list[bytes]:
    reader = client.open_reader(name)
    info = client.stream_info(name)
    return [e.payload for e in reader.read(info.first_entry_id, info.lac)] if info.lac >= 0 else []


def test_a_bookie_lost_for_good_is_replicated_away(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(5, **FAST)
    names = ["idle-a", "idle-b", "live"]
    client = StreamClient.connect(cluster.metadata)
    expected: dict[str, list[bytes]] = {}
    stop_writer = threading.Event()
    live_errors: list[BaseException] = []
    try:
        for name in names:
            client.create_stream(
                name, ensemble=3, write_quorum=3, ack_quorum=2, fragment_max_entries=150
            )
        for name in names[:2]:
            expected[name] = fill(client, name, 1200)
        expected["live"] = fill(client, "live", 600)
        live = client.open_writer("live")
        appended = expected["live"]

        def keep_writing() -> None:
            i = len(appended)
            while not stop_writer.is_set():
                try:
                    live.append(payload("live", i))
                except BaseException as e:  # the test fails on any
                    live_errors.append(e)
                    return
                appended.append(payload("live", i))
                i += 1
                time.sleep(0.005)

        writer_thread = threading.Thread(target=keep_writing, daemon=True)
        writer_thread.start()
        with session_of(cluster) as session:
            counts = {b.bookie_id: naming(session, names, b.bookie_id) for b in cluster.bookies}
            victim = max(counts, key=lambda b: counts[b])
            named = counts[victim]
            cluster.bookie(victim).kill9()
            killed = time.monotonic()
            took = wait_for(
                lambda: (
                    naming(session, names, victim) == 0
                    and not UnderreplicationStore(session).markers()
                ),
                180,
                f"no fragment naming {victim}",
            )
            stop_writer.set()
            writer_thread.join(30)
            live.close()
            assert not live_errors, live_errors
            print(  # noqa: T201 - the figure of the must-show
                f"\n{named} fragments naming {victim} re-replicated {took:.1f}s after kill -9 "
                f"(delay {FAST['lost_bookie_recovery_delay_ms']} ms)"
            )
            assert time.monotonic() - killed < 180
            for name in names:
                assert read_all(client, name) == expected[name]
                assert_three_live_copies(cluster, session, name, {victim})
            live = [b for b in cluster.bookies if b.bookie_id != victim]
            assert sum(metric(b, "streamkeeper_autorecovery_auditor_leading") for b in live) == 1
            assert (
                sum(metric(b, "streamkeeper_autorecovery_fragments_replicated_total") for b in live)
                > 0
            )
    finally:
        stop_writer.set()
        client.close()


def _lost_fragments(
    cluster: SandboxCluster, client: StreamClient, name: str, count: int, size: int
) -> tuple[str, list[Marker], list[bytes]]:
    """Fills `name`, kills a bookie of it for good and marks its fragments by hand."""
    client.create_stream(
        name, ensemble=3, write_quorum=3, ack_quorum=2, fragment_max_entries=count // 10
    )
    with client.open_writer(name) as writer:
        futures = [writer.append_async(bytes([i % 251]) * size) for i in range(count)]
        writer.flush()
        for f in futures:
            f.result()
    expected = [bytes([i % 251]) * size for i in range(count)]
    with session_of(cluster) as session:
        fragments = fragments_of(session, name)
        victim = fragments[0].ensemble[0]
        cluster.bookie(victim).kill9()
        meta, _ = StreamStore(session).get_stream(name)
        markers = [
            Marker(meta.id, f.first_entry_id, (victim,), "lost")
            for f in fragments[:-1]
            if victim in f.ensemble
        ]
        store = UnderreplicationStore(session)
        for marker in markers:
            store.mark(marker)
    return victim, markers, expected


def test_two_workers_never_copy_one_marker_at_once(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(4)
    client = StreamClient.connect(cluster.metadata)
    try:
        victim, markers, expected = _lost_fragments(cluster, client, "shared", 4000, 256)
        assert len(markers) >= 3
        # The lock itself: one holder; another session gets it once the first session goes.
        with session_of(cluster) as one, session_of(cluster) as two:
            assert UnderreplicationStore(one).try_lock("probe", LockInfo("one"))
            assert not UnderreplicationStore(two).try_lock("probe", LockInfo("two"))
        with session_of(cluster) as three:
            assert UnderreplicationStore(three).try_lock("probe", LockInfo("three"))
            UnderreplicationStore(three).unlock("probe")

        intervals: list[tuple[str, str, float, float]] = []

        async def work(session: MetadataSession, worker_id: str) -> None:
            metadata = ZkMetadata(session)
            transport = GrpcTransport(metadata.bookie_address)
            worker = ReplicationWorker(
                metadata=metadata,
                transport=transport,
                settings=AutoRecoverySettings(),
                identifier=worker_id,
            )
            original = worker.replicate

            async def recorded(marker: Marker) -> str:
                started = time.monotonic()
                try:
                    return await original(marker)
                finally:
                    intervals.append((marker.name, worker_id, started, time.monotonic()))

            worker.replicate = recorded  # type: ignore[method-assign]
            try:
                while await worker.work_once():
                    pass
            finally:
                await transport.close()
                metadata.close()

        def run(worker_id: str) -> None:
            import asyncio

            with session_of(cluster) as session:
                asyncio.run(work(session, worker_id))

        threads = [threading.Thread(target=run, args=(f"w{i}",)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        with session_of(cluster) as session:
            assert not UnderreplicationStore(session).markers()
            # Only the open last fragment (the writer's business) may still name it.
            assert all(victim not in f.ensemble for f in fragments_of(session, "shared")[:-1])
        by_marker: dict[str, list[tuple[str, float, float]]] = {}
        for name, worker_id, start, end in intervals:
            by_marker.setdefault(name, []).append((worker_id, start, end))
        assert set(by_marker) == {m.name for m in markers}
        for spans in by_marker.values():
            spans.sort(key=lambda s: s[1])
            for (_, _, end), (_, start, _) in zip(spans, spans[1:], strict=False):
                assert end <= start, spans  # never two copies of one marker at once
        assert {w for w in (i[1] for i in intervals)} == {"w0", "w1"}
        assert read_all(client, "shared") == expected
    finally:
        client.close()


def test_a_worker_killed_mid_copy_leaves_the_marker_for_another(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(4)
    client = StreamClient.connect(cluster.metadata)
    worker = None
    try:
        victim, markers, expected = _lost_fragments(cluster, client, "slow", 8000, 1024)
        marker = markers[0]
        with session_of(cluster) as session:
            store = UnderreplicationStore(session)
            for other in markers[1:]:
                store.unmark(other.name)
            # A real worker process, throttled so that the kill lands mid-copy.
            log_path = cluster.data_dir / "worker.log"
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "stream.cli.main",
                    "--metadata",
                    cluster.metadata,
                    "autorecovery",
                    "run",
                    "--no-auditor",
                    "--rate-limit",
                    "100KiB",
                    "--session-timeout",
                    "4s",
                    "--id",
                    "doomed",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )

            def copying() -> bool:
                lock = store.lock_info(marker.name)
                return lock is not None and lock.copied_entries > 0

            try:
                wait_for(copying, 60, "the worker to start copying")
            except AssertionError:
                print(log_path.read_text()[-3000:])  # noqa: T201 - why it did not start
                raise
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
            lock = store.lock_info(marker.name)
            assert lock is not None and lock.owner.startswith("doomed")
            assert store.marker(marker.name) is not None
            wait_for(lambda: store.lock_info(marker.name) is None, 30, "the dead worker's lock")
            assert store.marker(marker.name) is not None  # still there for another
            listed = streamctl(cluster.metadata, "underreplicated", columns=200)
            assert listed.returncode == 0, listed.stderr
            assert "under-replicated fragments: 1" in listed.stdout
            assert "slow" in listed.stdout and "lost" in listed.stdout and victim in listed.stdout

            import asyncio

            async def finish() -> int:
                metadata = ZkMetadata(session)
                transport = GrpcTransport(metadata.bookie_address)
                other = ReplicationWorker(
                    metadata=metadata,
                    transport=transport,
                    settings=AutoRecoverySettings(),
                    identifier="rescuer",
                )
                try:
                    while await other.work_once():
                        pass
                    return other.total.fragments
                finally:
                    await transport.close()
                    metadata.close()

            assert asyncio.run(finish()) == 1
            assert store.marker(marker.name) is None
            fragment = next(
                f
                for f in fragments_of(session, "slow")
                if f.first_entry_id == marker.first_entry_id
            )
            assert victim not in fragment.ensemble
            assert_three_live_copies(
                cluster, session, "slow", {victim}, only_first=marker.first_entry_id
            )
        assert read_all(client, "slow") == expected
    finally:
        if worker is not None and worker.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
        client.close()


def test_decommission_drains_a_live_bookie_unnoticed(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(4, **FAST)
    client = StreamClient.connect(cluster.metadata)
    stop = threading.Event()
    errors: list[BaseException] = []
    appended: list[bytes] = []
    seen: list[bytes] = []
    try:
        client.create_stream(
            "busy", ensemble=3, write_quorum=3, ack_quorum=2, fragment_max_entries=300
        )
        client.create_stream("quiet", ensemble=3, write_quorum=3, ack_quorum=2)
        quiet = fill(client, "quiet", 500)  # its writer is gone: a takeover must move it
        appended.extend(fill(client, "busy", 900))
        writer = client.open_writer("busy")

        def write() -> None:
            i = len(appended)
            while not stop.is_set():
                try:
                    writer.append(payload("busy", i))
                except BaseException as e:
                    errors.append(e)
                    return
                appended.append(payload("busy", i))
                i += 1
                time.sleep(0.003)

        def tail() -> None:
            try:
                for entry in client.open_reader("busy").tail(start="earliest", timeout_s=3):
                    seen.append(entry.payload)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=f, daemon=True) for f in (write, tail)]
        for t in threads:
            t.start()
        wait_for(lambda: len(appended) > 950, 30, "the writer to append")
        with session_of(cluster) as session:
            # A bookie of both last fragments (two 3-of-4 ensembles share two).
            shared = set(fragments_of(session, "busy")[-1].ensemble)
            victim = sorted(shared & set(fragments_of(session, "quiet")[-1].ensemble))[0]
            typo = streamctl(cluster.metadata, "bookie", "decommission", "bookie-99")
            assert typo.returncode == 3 and "unknown bookie" in typo.stderr  # not found
            assert UnderreplicationStore(session).draining() == set()
            result = streamctl(
                cluster.metadata,
                "bookie",
                "decommission",
                victim,
                "--timeout",
                "120s",
                timeout_s=180,
            )
            assert result.returncode == 0, result.stderr
            drained_at = len(appended)
            wait_for(lambda: len(appended) > drained_at + 50, 30, "appends after the drain")
            stop.set()
            threads[0].join(30)
            writer.close()
            assert not errors, errors
            assert naming(session, ["busy", "quiet"], victim) == 0
            assert_three_live_copies(cluster, session, "busy", {victim})
            assert_three_live_copies(cluster, session, "quiet", {victim})
        assert cluster.bookie(victim).running  # drained, not dead
        threads[1].join(60)  # the tail ends 3 s after the last entry
        assert not errors, errors
        assert seen == appended
        assert read_all(client, "busy") == appended
        assert read_all(client, "quiet") == quiet
    finally:
        stop.set()
        client.close()


def _left_and_rejoined(bookie_id: str, fragments: list[Any]) -> bool:
    """Returns whether `bookie_id` is in a fragment after one that does not name it."""
    left = False
    for fragment in fragments:
        if bookie_id not in fragment.ensemble:
            left = True
        elif left:
            return True
    return False


def test_the_scrub_finds_a_bookie_that_lost_entries(cluster_factory: ClusterFactory) -> None:
    import asyncio

    from stream.autorecovery.scrub import Scrubber

    cluster = cluster_factory(4)
    client = StreamClient.connect(cluster.metadata)
    try:
        client.create_stream(
            "scrubbed", ensemble=3, write_quorum=3, ack_quorum=2, fragment_max_entries=500
        )
        expected = fill(client, "scrubbed", 1600)

        async def scrub_then_repair(session: MetadataSession, full: bool) -> tuple[int, int]:
            metadata = ZkMetadata(session)
            transport = GrpcTransport(metadata.bookie_address)
            try:
                report = await Scrubber(metadata=metadata, transport=transport, timeout_s=10).scrub(
                    full=full
                )
                worker = ReplicationWorker(
                    metadata=metadata,
                    transport=transport,
                    settings=AutoRecoverySettings(),
                    identifier="scrub-test",
                )
                while await worker.work_once():
                    pass
                return report.marked, worker.total.fragments
            finally:
                await transport.close()
                metadata.close()

        with session_of(cluster) as session:
            # Healthy: neither pass finds anything.
            assert asyncio.run(scrub_then_repair(session, full=True)) == (0, 0)
            assert asyncio.run(scrub_then_repair(session, full=False)) == (0, 0)
            meta, _ = StreamStore(session).get_stream("scrubbed")
            fragments = fragments_of(session, "scrubbed")
            # A member of the first fragment that never left the ensemble and came back: one
            # that did got the new-member truncation of the fragment it rejoined (after its
            # first entry - 1), and the bookie refuses a lower point of the same term as
            # stale (placement decided it: the test failed about one run in two). With four
            # bookies and three per fragment, at most two of the first three rejoin.
            damaged = next(b for b in fragments[0].ensemble if not _left_and_rejoined(b, fragments))
            # The bookie loses every entry above 250 (a truncation at the stream's term).
            answer = (
                cluster.bookie(damaged)
                .stub()
                .Truncate(
                    pb.TruncateRequest(stream_id=meta.id, term=meta.term, after_entry_id=250),
                    timeout=10,
                )
            )
            assert answer.code == pb.OK
            short = sum(1 for f in fragments[:-1] if damaged in f.ensemble)
            marked, repaired = asyncio.run(scrub_then_repair(session, full=False))
            assert (marked, repaired) == (short, short)
            assert all(damaged not in f.ensemble for f in fragments_of(session, "scrubbed")[:-1])
            assert_three_live_copies(cluster, session, "scrubbed", set())
            assert asyncio.run(scrub_then_repair(session, full=True)) == (0, 0)
        assert read_all(client, "scrubbed") == expected
    finally:
        client.close()


def test_the_auditor_waits_out_the_delays(cluster_factory: ClusterFactory) -> None:
    """On a clock of its own: a bookie back within the lost-bookie delay costs nothing; after
    the delay its closed fragments are marked; the open last fragment of a stream without a
    writer waits for its grace, then a takeover closes it and it is marked too."""
    import asyncio

    from stream.autorecovery.auditor import Auditor

    cluster = cluster_factory(4)
    client = StreamClient.connect(cluster.metadata)
    now = [1000.0]
    try:
        client.create_stream(
            "audited", ensemble=3, write_quorum=3, ack_quorum=2, fragment_max_entries=100
        )
        expected = fill(client, "audited", 350)
        settings = AutoRecoverySettings(
            lost_bookie_recovery_delay_ms=30_000, open_stream_replication_delay_ms=60_000
        )
        with session_of(cluster) as session:
            last = fragments_of(session, "audited")[-1]
            victim = last.ensemble[0]
            closed_naming = sum(
                1 for f in fragments_of(session, "audited")[:-1] if victim in f.ensemble
            )
            store = UnderreplicationStore(session)

            async def audit_at(t: float) -> Any:
                now[0] = t
                return await auditor.audit()

            async def scenario() -> None:
                nonlocal auditor
                metadata = ZkMetadata(session)
                transport = GrpcTransport(metadata.bookie_address)
                auditor = Auditor(
                    metadata=metadata,
                    transport=transport,
                    settings=settings,
                    identifier="test",
                    monotonic=lambda: now[0],
                )
                try:
                    assert (await audit_at(1000)).bad == {}
                    # Gone and back within the delay: nothing.
                    cluster.bookie(victim).kill9()
                    await asyncio.to_thread(
                        wait_for, lambda: victim not in cluster.registered_bookies(), 30, "gone"
                    )
                    assert (await audit_at(1001)).bad == {}
                    assert (await audit_at(1025)).bad == {}
                    cluster.bookie(victim).restart()
                    await asyncio.to_thread(
                        wait_for, lambda: victim in cluster.registered_bookies(), 30, "back"
                    )
                    assert (await audit_at(1040)).bad == {}
                    assert store.markers() == []
                    # Gone for good: marked once the delay has passed since it left.
                    cluster.bookie(victim).kill9()
                    await asyncio.to_thread(
                        wait_for, lambda: victim not in cluster.registered_bookies(), 30, "gone"
                    )
                    assert (await audit_at(1050)).marked == 0
                    report = await audit_at(1079)
                    assert report.bad == {} and report.marked == 0
                    report = await audit_at(1081)
                    assert report.bad == {victim: "lost"}
                    assert report.marked == closed_naming and report.open_waiting == 1
                    assert (await audit_at(1130)).takeovers == 0  # grace runs from 1081
                    report = await audit_at(1142)
                    assert report.takeovers == 1 and report.marked == 1
                finally:
                    await transport.close()
                    metadata.close()

            auditor: Any = None
            asyncio.run(scenario())
            firsts = {m.first_entry_id for m in store.markers()}
            assert last.first_entry_id in firsts and len(firsts) == closed_naming + 1
            assert victim not in fragments_of(session, "audited")[-1].ensemble
        assert read_all(client, "audited") == expected
    finally:
        client.close()


def test_one_auditor_leads_at_a_time(metadata_root: str) -> None:
    from stream.autorecovery.service import AutoRecovery

    sessions = [MetadataSession.connect(metadata_root, session_timeout_s=4.0) for _ in range(2)]
    services = [
        AutoRecovery(s, AutoRecoverySettings(replication_workers=0), identifier=f"a{i}")
        for i, s in enumerate(sessions)
    ]
    try:
        for service in services:
            service.start()
        wait_for(lambda: any(s.leading for s in services), 30, "a leader")
        watched_until = time.monotonic() + 1.0
        while time.monotonic() < watched_until:  # never two at once
            assert [s.leading for s in services].count(True) == 1
            time.sleep(0.05)
        leader = next(s for s in services if s.leading)
        other = next(s for s in services if not s.leading)
        assert leader.audits >= 1
        leader.stop()
        wait_for(lambda: other.leading, 30, "the other candidate to lead")
        assert not leader.leading
    finally:
        for service in services:
            service.stop()
        for session in sessions:
            session.close()


def test_the_auditor_leaves_a_stream_whose_writer_came_back(
    cluster_factory: ClusterFactory,
) -> None:
    """Issue 14 item 6: the open last fragment of a stream without a live writer names a lost
    bookie and its grace is over, but a writer comes (opens the stream and registers) right
    after the auditor looked: the auditor looks again just before its takeover and leaves the
    stream to that writer, which goes on unfenced."""
    import asyncio

    from stream.autorecovery.auditor import Auditor

    cluster = cluster_factory(4)
    client = StreamClient.connect(cluster.metadata)
    now = [1000.0]
    try:
        client.create_stream("returning", ensemble=3, write_quorum=3, ack_quorum=2)
        expected = fill(client, "returning", 20)  # closes its writer: nobody writes now
        settings = AutoRecoverySettings(
            lost_bookie_recovery_delay_ms=30_000, open_stream_replication_delay_ms=60_000
        )
        with session_of(cluster) as session:
            victim = fragments_of(session, "returning")[-1].ensemble[0]
            cluster.bookie(victim).kill9()
            wait_for(lambda: victim not in cluster.registered_bookies(), 30, "gone")
            came_back: list[Any] = []

            async def scenario() -> None:
                metadata = ZkMetadata(session)
                transport = GrpcTransport(metadata.bookie_address)
                auditor = Auditor(
                    metadata=metadata,
                    transport=transport,
                    settings=settings,
                    identifier="test",
                    monotonic=lambda: now[0],
                )
                writer_alive = metadata.store.writer_alive

                def alive_then_a_writer_comes(stream_id: int) -> bool:
                    alive = writer_alive(stream_id)
                    if now[0] >= 1100 and not came_back:
                        came_back.append(client.open_writer("returning"))
                    return alive

                metadata.store.writer_alive = alive_then_a_writer_comes  # type: ignore[method-assign]
                try:
                    now[0] = 1000
                    await auditor.audit()  # the victim's delay starts
                    now[0] = 1031
                    assert (await auditor.audit()).open_waiting == 1  # its grace starts
                    now[0] = 1100
                    report = await auditor.audit()
                    assert came_back, "the writer never came"
                    assert report.takeovers == 0 and report.open_left_to_writer == 1
                finally:
                    await transport.close()
                    metadata.close()

            asyncio.run(scenario())
            writer = came_back[0]
            # Not fenced: its term is the stream's, and it appends.
            assert client.stream_info("returning").term == writer.term
            writer.append(b"still the writer", timeout_s=30)
            writer.close()
        assert read_all(client, "returning") == [*expected, b"still the writer"]
    finally:
        client.close()
