"""Real bookie processes: the cookie check refuses swapped or wiped directories, and a bad
configuration stops the process with exit code 1 naming the key."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from stream.bookie.cookie import COOKIE_FILE, Cookie
from stream.metadata import paths
from stream.sandbox.ports import free_port
from stream.sandbox.zookeeper import ZooKeeperServer
from stream.wire import bookie_pb2 as pb
from tests.integration.bookie_support import (
    METADATA_UNCHECKED,
    BookieFactory,
    add_all,
    add_request,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def bookies(tmp_path: Path, metadata_root: str) -> Iterator[BookieFactory]:
    factory = BookieFactory(tmp_path, metadata_root, unsafe_skips=METADATA_UNCHECKED)
    try:
        yield factory
    finally:
        factory.stop_all()


def test_cookie_check_refuses_swapped_ledger_dirs(
    bookies: BookieFactory, metadata_root: str
) -> None:
    b1 = bookies.start("bookie-1")
    b2 = bookies.start("bookie-2")
    for stream_id, bookie in ((1, b1), (2, b2)):
        [r] = add_all(bookie.stub(), [add_request(stream_id, 1, range(10))])
        assert set(r.codes) == {pb.OK}
    # The cookie is registered in ZooKeeper and in every directory.
    zk = KazooClient(hosts=metadata_root)
    zk.start(timeout=10)
    try:
        registered = Cookie.from_json(zk.get(paths.BOOKIES_COOKIES + "/bookie-1")[0])
    finally:
        zk.stop()
        zk.close()
    dirs1 = {n: b1.data_dir / "data" / n for n in ("journal", "ledgers", "index")}
    for path in dirs1.values():
        assert Cookie.from_json((path / COOKIE_FILE).read_bytes()) == registered
    assert registered.address == b1.address

    assert b1.terminate() == 0
    assert b2.terminate() == 0
    l1, l2 = dirs1["ledgers"], b2.data_dir / "data" / "ledgers"
    tmp = l1.with_name("swap")
    l1.rename(tmp)
    l2.rename(l1)
    tmp.rename(l2)

    for bookie in (b1, b2):
        bookie.start()
        assert bookie.wait_exit(30) == 1
        tail = bookie.log_tail(5)
        assert "cookie mismatch" in tail
        assert "directory ledgers" in tail
        assert "swapped" in tail
        assert "streamctl bookie fix-cookie" in tail
    # Swapped back, both serve again with their data.
    l1.rename(tmp)
    l2.rename(l1)
    tmp.rename(l2)
    for stream_id, bookie in ((1, b1), (2, b2)):
        bookie.start()
        bookie.wait_ready()
        r = bookie.stub().Read(pb.ReadRequest(stream_id=stream_id, entry_id=9), timeout=10)
        assert r.code == pb.OK


def test_cookie_check_refuses_a_wiped_directory(bookies: BookieFactory) -> None:
    bookie = bookies.start("bookie-1")
    add_all(bookie.stub(), [add_request(1, 1, range(10))])
    assert bookie.terminate() == 0
    journal = bookie.data_dir / "data" / "journal"
    shutil.rmtree(journal)
    journal.mkdir()
    bookie.start()
    assert bookie.wait_exit(30) == 1
    tail = bookie.log_tail(5)
    assert "directory journal" in tail and "has no cookie" in tail
    assert "may be lost" in tail


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"bogus_key": 1}, "bogus_key"),
        ({"flush_interval_ms": -1}, "flush_interval_ms"),
        ({"journal_write_data": "yes"}, "journal_write_data"),
        ({"disk_usage_threshold": 2.0}, "disk_usage_threshold"),
    ],
)
def test_bad_config_exits_1_naming_the_key(
    bookies: BookieFactory, settings: dict[str, object], named: str
) -> None:
    bookie = bookies.create("bookie-1", **settings).start()
    assert bookie.wait_exit(30) == 1
    tail = bookie.log_tail(3)
    assert "streamctl: error:" in tail
    assert named in tail
    assert "Traceback" not in bookie.log_path.read_text()


@pytest.mark.parametrize("busy", ["listen", "data_listen", "metrics_listen"])
def test_a_start_on_a_busy_port_exits_1_and_leaves_no_cookie(
    bookies: BookieFactory, busy: str
) -> None:
    first = bookies.start("bookie-1")
    second = bookies.create("bookie-2")
    if busy == "listen":
        second.port = first.port
    elif busy == "data_listen":
        second.data_port = first.data_port
    else:
        second.metrics_port = first.port  # a port with a listener on it
    second.start()
    assert second.wait_exit(30) == 1
    said = {
        "listen": "cannot listen on",
        "data_listen": "(the data port)",
        "metrics_listen": "cannot serve metrics",
    }
    assert said[busy] in second.log_tail(3)
    # Refused before the cookie check and the storage: no cookie anywhere, so the corrected
    # start (another port) is a plain first boot, not a cookie mismatch.
    data = second.data_dir / "data"
    assert not data.exists() or not any(p.is_file() for p in data.rglob("*"))
    second.port, second.data_port, second.metrics_port = free_port(), free_port(), free_port()
    second.start()
    second.wait_ready(60)
    assert first.stub().Info(pb.InfoRequest(), timeout=10).bookie_id == "bookie-1"


def test_a_bookie_stops_cleanly_within_its_grace_period_without_zookeeper(
    tmp_path: Path,
) -> None:
    # Its own ZooKeeper, killed under it. The stop used to wait on ZooKeeper (auto-recovery,
    # unregistering) until SIGKILL.
    zookeeper = ZooKeeperServer(tmp_path / "zookeeper").start()
    factory = BookieFactory(tmp_path / "bookies", zookeeper.hosts)
    try:
        try:
            bookie = factory.start("bookie-1", shutdown_grace_ms=2000)
            add_all(bookie.stub(), [add_request(1, 1, range(10))])
        finally:
            zookeeper.stop()  # SIGTERM, then SIGKILL: gone either way
        deadline = time.monotonic() + 30
        while '"metadata.session_suspended"' not in bookie.log_path.read_text():
            assert time.monotonic() < deadline, bookie.log_tail(10)
            time.sleep(0.05)
        # A clean exit (0, not SIGKILL) well before the 10 s a stop used to spend on
        # ZooKeeper; what it skipped is in its log, not in a timed assertion (1.5 s here).
        assert bookie.terminate(timeout_s=8) == 0
        log_text = bookie.log_path.read_text()
        assert '"bookie.stopped"' in log_text
        assert '"bookie.unregister_skipped"' in log_text
    finally:
        factory.stop_all()


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
def test_a_bookie_serves_on_the_event_loop_it_is_given(
    bookies: BookieFactory, event_loop: str
) -> None:
    bookie = bookies.start("bookie-1", event_loop=event_loop)
    add_all(bookie.stub(), [add_request(1, 1, range(10))])
    maps = Path(f"/proc/{bookie.pid}/maps").read_text()
    assert ("uvloop" in maps) == (event_loop == "uvloop")
    assert bookie.terminate(timeout_s=8) == 0
