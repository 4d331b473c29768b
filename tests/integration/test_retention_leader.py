"""Two `streamctl retention run` processes on one metadata root: one leads; when the leader
freezes long enough to lose its ZooKeeper session, the other takes over and keeps trimming;
the frozen one, resumed, finds its session gone and contends again; when the new leader is
killed, it leads again. Fragments are built straight in ZooKeeper (no bookies: the Trim
messages go nowhere, which the service shrugs off)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from stream.metadata import MetadataSession, RetentionPolicy, StreamStore
from stream.retention.service import ELECTION_PATH
from stream.sandbox.retention import RetentionProcess
from stream.sandbox.zookeeper import ZooKeeperServer
from tests.integration.retention_support import wait_until
from tests.unit.retention.support import build_stream

pytestmark = pytest.mark.integration

SESSION_TIMEOUT_S = 2.0


@pytest.fixture
def services(metadata_root: str, tmp_path: Path) -> Iterator[dict[str, RetentionProcess]]:
    made = {
        name: RetentionProcess(
            metadata_root,
            tmp_path / f"{name}.log",
            interval_s=0.2,
            instance_id=name,
            session_timeout_s=SESSION_TIMEOUT_S,
        ).start()
        for name in ("ret-a", "ret-b")
    }
    try:
        yield made
    finally:
        for process in made.values():
            if process.process is not None and process.running:
                os.kill(process.process.pid, signal.SIGCONT)  # a frozen one must hear SIGTERM
            process.stop()


def leader(zookeeper: ZooKeeperServer, metadata_root: str) -> str | None:
    """Returns the id of the contender holding the election lock, None without one."""
    root = metadata_root[metadata_root.index("/") :]
    zk = KazooClient(hosts=zookeeper.hosts + root)
    zk.start(timeout=10)
    try:
        contenders = zk.Lock(ELECTION_PATH).contenders()
    finally:
        zk.stop()
        zk.close()
    return contenders[0] if contenders else None


def test_leadership_moves_when_the_leader_loses_its_session_and_trimming_goes_on(
    services: dict[str, RetentionProcess], zookeeper: ZooKeeperServer, metadata_root: str
) -> None:
    with MetadataSession.connect(metadata_root) as session:
        store = StreamStore(session)
        policy = RetentionPolicy(max_bytes=10)

        def trimmed_by_the_leader(name: str) -> None:
            # Built first, the policy set after: a round must not trim it while it is built.
            meta = build_stream(store, name, [(10, 1)] * 4)
            store.set_retention(meta.id, policy)
            wait_until(lambda: len(store.get_fragments(meta.id)) == 2, what=f"{name} trimmed")

        first = wait_until(lambda: leader(zookeeper, metadata_root), what="a leader")
        second = "ret-b" if first == "ret-a" else "ret-a"
        services[first].wait_logged("retention.elected")
        trimmed_by_the_leader("one")

        # The leader freezes (a long GC pause, a stopped VM): its session expires.
        frozen = services[first].process
        assert frozen is not None
        os.kill(frozen.pid, signal.SIGSTOP)
        wait_until(lambda: leader(zookeeper, metadata_root) == second, what="the other to lead")
        services[second].wait_logged("retention.elected")
        trimmed_by_the_leader("two")

        # Resumed, it finds its session gone, steps down and contends again.
        os.kill(frozen.pid, signal.SIGCONT)
        services[first].wait_logged("retention.leadership_lost")
        wait_until(
            lambda: services[first].log_text().count('"metadata.session_connected"') >= 2,
            what="a new session for the resumed one",
        )
        assert leader(zookeeper, metadata_root) == second

        # The leader dies: the resumed one leads (after the dead one's session times out).
        services[second].kill9()
        wait_until(lambda: leader(zookeeper, metadata_root) == first, what="the first to lead")
        trimmed_by_the_leader("three")
        assert services[first].running
