"""Shared fixtures: a real ZooKeeper (Debian's jars) on a free loopback port."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import kazoo.protocol.connection
import kazoo.retry
import pytest
from hypothesis import HealthCheck, settings
from kazoo.client import KazooClient

from stream.sandbox.zookeeper import ZooKeeperServer

# Property tests judge behaviour, not speed: on a loaded 2-core CI machine an example may take
# longer than hypothesis' default 200 ms deadline.
settings.register_profile(
    "streamkeeper", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("streamkeeper")

# kazoo draws its connection loop's and retries' jitter from the global `random`, on its own
# threads, at every wake-up of a live client. Hypothesis checks that the global random does not
# move while it draws an example, and took those draws for a strategy using `random` (its
# deprecation warnings, in whichever property test a client of an earlier test woke during).
# kazoo gets a Random of its own in the test process.
for _module in (kazoo.protocol.connection, kazoo.retry):
    _module.random = random.Random()  # type: ignore[assignment]

# What the fast tier leaves out: real processes (ZooKeeper, bookies, Spark, network namespaces)
# and the long simulator sweeps; scripts/test.sh --fast adds a short sweep instead.
_SLOW_MARKERS = ("integration", "chaos", "spark", "sweep")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="the edit loop's tier: no ZooKeeper, no bookie processes, no long sweeps",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test that needs the real ZooKeeper (and so any bookie process) is an integration test
    # wherever it lives, whether or not its module says so.
    for item in items:
        if "zookeeper" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)
    if not config.getoption("--fast"):
        return
    kept = [i for i in items if not any(i.get_closest_marker(m) for m in _SLOW_MARKERS)]
    config.hook.pytest_deselected(items=[i for i in items if i not in kept])
    items[:] = kept


@pytest.fixture(autouse=True, scope="session")
def _no_processes_in_the_fast_tier(request: pytest.FixtureRequest) -> Iterator[None]:
    """In the fast tier, starting a ZooKeeper fails the test that tried: it belongs to the
    integration tier (bookies need ZooKeeper, so this keeps them out too)."""
    if not request.config.getoption("--fast"):
        yield
        return

    def refuse(self: ZooKeeperServer) -> None:
        raise AssertionError("the fast tier starts no ZooKeeper: mark the test integration")

    patch = pytest.MonkeyPatch()
    patch.setattr(ZooKeeperServer, "start", refuse)
    yield
    patch.undo()


class _UnsyncedZooKeeper(ZooKeeperServer):
    """The session's ZooKeeper without an fsync per transaction (`forceSync=no`): it is never
    crashed (tests that kill a ZooKeeper start their own), so the sync only costs time, about
    half of a metadata-bound test such as 10,000 takeovers on a loaded machine."""

    def _write_config(self) -> Path:
        cfg = super()._write_config()
        with cfg.open("a") as f:
            f.write("forceSync=no\n")
        return cfg


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One ZooKeeper server for the whole test session; tests isolate themselves by chroot."""
    server = _UnsyncedZooKeeper(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def metadata_root(zookeeper: ZooKeeperServer) -> str:
    """A fresh connect string `host:port/streamkeeper-<random>` (the chroot path exists)."""
    root = f"/streamkeeper-{uuid.uuid4().hex[:12]}"
    zk = KazooClient(hosts=zookeeper.hosts)
    zk.start(timeout=10)
    try:
        zk.ensure_path(root)
    finally:
        zk.stop()
        zk.close()
    return zookeeper.connect_string(root)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path
