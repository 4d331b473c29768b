"""Bookie failures under a live writer, on real processes: `kill -9` of an ensemble member during
appends (ensemble change, nothing acknowledged lost, appends keep working), and too few bookies
left (appends fail with NotEnoughBookiesError instead of hanging), and two ensemble members
frozen together (both replaced; the writer keeps acknowledging)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import threading
import time

import pytest

from stream.client import StreamClient, WriterOptions
from stream.errors import NotEnoughBookiesError, StreamError, WriterClosedError
from tests.integration.cli_support import streamctl
from tests.integration.conftest import ClusterFactory
from tests.integration.replication_support import assert_three_live_copies, session_of

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


def test_two_bookies_frozen_together_the_writer_keeps_acknowledging(
    cluster_factory: ClusterFactory,
) -> None:
    # Issue 14 item 2: both fail in one watchdog tick (add timeout 1 s). The change replacing
    # the first used to reopen the second's link and forget it had failed, without resending
    # what it missed; thawed before that link's adds timed out, nothing failed again: LAFR
    # stayed, the window filled and appends never resolved.
    cluster = cluster_factory(5)
    options = WriterOptions(add_timeout_s=1.0, window_entries=2048)
    with StreamClient.connect(cluster.metadata, writer_options=options) as client:
        client.create_stream("frozen", ensemble=3, write_quorum=3, ack_quorum=2)
        with client.open_writer("frozen") as writer:
            futures = [writer.append_async(payload(i)) for i in range(2_000)]
            writer.flush()
            ensemble = client.stream_info("frozen").fragments[-1].ensemble
            frozen = [cluster.bookie(b).pid for b in ensemble[1:]]
            thawed = threading.Event()

            def freeze() -> None:
                for pid in frozen:
                    os.kill(pid, signal.SIGSTOP)
                time.sleep(1.8)  # past the add timeout, thawed before the reopened link's
                for pid in frozen:
                    os.kill(pid, signal.SIGCONT)
                thawed.set()

            acked_at_thaw: list[int] = []

            def append_through() -> None:
                # Appends go on from another thread: a stalled writer's full window blocks
                # `append_async` itself.
                with contextlib.suppress(WriterClosedError):
                    while not thawed.is_set():
                        futures.append(writer.append_async(payload(len(futures))))
                    acked_at_thaw.append(sum(f.done() for f in futures))
                    for _ in range(5_000):
                        futures.append(writer.append_async(payload(len(futures))))

            freezer = threading.Thread(target=freeze)
            appender = threading.Thread(target=append_through)
            freezer.start()
            appender.start()
            try:
                # Every append is acknowledged, in order, well within the bound (a stall used
                # to leave them pending for ever).
                appender.join(timeout=60)
                _, pending = concurrent.futures.wait(futures, timeout=60)
                if appender.is_alive() or pending:
                    writer.abort()  # a stalled writer's flush would wait for ever
                    pytest.fail(f"{len(pending)} appends pending 60 s after the thaw: stalled")
                ids = [f.result() for f in futures]
            finally:
                freezer.join()
                appender.join()
                for pid in frozen:
                    os.kill(pid, signal.SIGCONT)
            assert ids == list(range(len(futures)))
            assert len(futures) > acked_at_thaw[0]
            writer.flush()
        info = client.stream_info("frozen")
        # Both frozen bookies were replaced (a later roll may place them again).
        assert any(not set(ensemble[1:]) & set(f.ensemble) for f in info.fragments), info
    with session_of(cluster) as session:
        assert_three_live_copies(cluster, session, "frozen", dead=set())


def test_info_says_what_a_stuck_takeover_waits_for(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(3)
    options = WriterOptions(takeover_deadline_s=2.0, fence_timeout_s=0.5)
    with StreamClient.connect(cluster.metadata, writer_options=options) as client:
        client.create_stream("stuck", ensemble=3, write_quorum=3, ack_quorum=2)
        with client.open_writer("stuck") as writer:
            writer.append(b"kept")
        info = client.stream_info("stuck")
        assert info.waiting_for is None
        assert [b.state for b in info.bookies] == ["available"] * 3
        assert [b.limbo for b in info.bookies] == [False] * 3
        down = info.fragments[-1].ensemble[1:]
        for bookie_id in down:
            cluster.bookie(bookie_id).kill9()
        cluster.wait_registered(1, timeout_s=30)
        with pytest.raises(StreamError):
            client.open_writer("stuck")  # its fence gets one answer of the two it needs
        info = client.stream_info("stuck")
    assert info.state == "IN_RECOVERY"
    assert {b.bookie_id for b in info.bookies if b.state == "down"} == set(down)
    assert info.waiting_for is not None
    assert info.waiting_for.startswith("bookies: a takeover needs 2 of the last fragment's 3")
    shown = streamctl(cluster.metadata, "info", "stuck", columns=200)
    assert shown.returncode == 0, shown.stderr
    assert "waiting for" in shown.stdout and "a takeover needs 2" in shown.stdout
    assert all(f"{b} │ down" in shown.stdout for b in down), shown.stdout
    as_json = json.loads(streamctl(cluster.metadata, "info", "stuck", "--output", "json").stdout)
    assert as_json["waiting_for"] == info.waiting_for
    assert [b["state"] for b in as_json["bookies"]].count("down") == 2
