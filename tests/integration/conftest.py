"""Fixtures of the integration tests: whole sandbox clusters (bookie processes) on the shared
ZooKeeper of tests/conftest.py, each under its own metadata root."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from stream.client import StreamClient
from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.zookeeper import ZooKeeperServer
from tests.integration.bookie_support import stop_cluster

ClusterFactory = Callable[..., SandboxCluster]


def _settings(bookie_settings: dict[str, Any]) -> dict[str, Any]:
    """Auto-recovery stays off unless a test turns it on: a test that kills a bookie must not
    have the auditor repair fragments under it after the delay."""
    return {"autorecovery": False, **bookie_settings}


@contextlib.contextmanager
def running_cluster(
    zookeeper: ZooKeeperServer,
    path: Path,
    bookies: int = 3,
    *,
    secure: bool = False,
    unsafe_skips: Sequence[str] = (),
    **bookie_settings: Any,
) -> Iterator[SandboxCluster]:
    """A started cluster of `bookies` bookie processes under a metadata root of its own,
    stopped on exit (for fixtures shared by a module or the session). `secure`: mutual TLS
    and roles, certificates in `cluster.tls`; `unsafe_skips`: the bookies' test-only
    switches (`stream.bookie.unsafe`)."""
    cluster = SandboxCluster(
        path,
        bookies=bookies,
        root=f"/streamkeeper-{uuid.uuid4().hex[:12]}",
        zookeeper=zookeeper,
        bookie_settings=_settings(bookie_settings),
        secure=secure,
        unsafe_skips=unsafe_skips,
    )
    cluster.start()
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture
def cluster_factory(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[ClusterFactory]:
    """Returns `make(bookies=3, *, unsafe_skips=(), **bookie_settings) -> SandboxCluster`
    (started; `unsafe_skips` as `running_cluster`'s); every cluster made is stopped at the end
    of the test."""
    made: list[SandboxCluster] = []

    def make(
        bookies: int = 3, *, unsafe_skips: Sequence[str] = (), **bookie_settings: Any
    ) -> SandboxCluster:
        cluster = SandboxCluster(
            tmp_path / f"cluster-{len(made)}",
            bookies=bookies,
            root=f"/streamkeeper-{uuid.uuid4().hex[:12]}",
            zookeeper=zookeeper,
            bookie_settings=_settings(bookie_settings),
            unsafe_skips=unsafe_skips,
        )
        made.append(cluster)
        return cluster.start()

    try:
        yield make
    finally:
        for cluster in made:
            stop_cluster(cluster)


@pytest.fixture(scope="module")
def module_cluster(
    zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandboxCluster]:
    """Three bookies with default settings, started once for a module."""
    with running_cluster(zookeeper, tmp_path_factory.mktemp("module-cluster")) as cluster:
        yield cluster


@pytest.fixture
def cluster(request: pytest.FixtureRequest, cluster_factory: ClusterFactory) -> SandboxCluster:
    """Three bookies with default settings: for tests marked `shared_cluster` (a module's or
    single ones that kill no bookie, change no setting and use streams of their own) one
    cluster per module, since starting three bookies costs seconds per test; elsewhere one per
    test."""
    if request.node.get_closest_marker("shared_cluster"):
        shared: SandboxCluster = request.getfixturevalue("module_cluster")
        return shared
    return cluster_factory(3)


@pytest.fixture
def client(cluster: SandboxCluster) -> Iterator[StreamClient]:
    """A client of `cluster` (modules that define a `client` fixture of their own use theirs)."""
    with StreamClient.connect(cluster.metadata) as c:
        yield c
