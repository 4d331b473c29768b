"""BookieRegistry against a real ZooKeeper: registrations, their watch, cookies, and
re-registration after a session expiry."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from stream.errors import InvalidArgumentError, MetadataError
from stream.metadata import (
    BadVersionError,
    BookieRegistration,
    BookieRegistry,
    MetadataSession,
    SessionState,
    paths,
)
from tests.unit.metadata.conftest import expire_session, wait_until

pytestmark = pytest.mark.integration

REG1 = BookieRegistration(address="127.0.0.1:3181", free_bytes=100)
REG2 = BookieRegistration(address="127.0.0.1:3182")


def _owner(session: MetadataSession, bookie_id: str) -> int | None:
    stat = session.zk.exists(paths.bookie_available(bookie_id))
    return None if stat is None else int(stat.ephemeralOwner)


def test_register_update_available_unregister(session: MetadataSession) -> None:
    registry = BookieRegistry(session)
    assert registry.available() == {}
    registry.register("bookie-1", REG1)
    registry.register("bookie-2", REG2)
    assert registry.available() == {"bookie-1": REG1, "bookie-2": REG2}
    assert _owner(session, "bookie-1") == session.session_id
    read_only = BookieRegistration(address=REG1.address, read_only=True, free_bytes=5)
    registry.update("bookie-1", read_only)
    assert registry.available()["bookie-1"] == read_only
    registry.register("bookie-1", REG1)  # our own znode: an update
    assert registry.available()["bookie-1"] == REG1
    registry.unregister("bookie-1")
    registry.unregister("bookie-1")
    assert registry.available() == {"bookie-2": REG2}
    with pytest.raises(MetadataError, match="not registered"):
        registry.update("bookie-1", REG1)
    with pytest.raises(InvalidArgumentError):
        registry.register("../evil", REG1)


def test_malformed_registration_is_skipped(session: MetadataSession) -> None:
    registry = BookieRegistry(session)
    registry.register("bookie-1", REG1)
    session.zk.create(paths.bookie_available("junk"), b"{nope", ephemeral=True)
    assert registry.available() == {"bookie-1": REG1}


def test_register_waits_for_a_lingering_session(
    connect: Callable[..., MetadataSession],
) -> None:
    old = connect()
    BookieRegistry(old).register("bookie-1", REG1)
    # The restarted bookie: a new session, with the old one still alive for a moment.
    new = connect(session_timeout_s=4.0)
    registered = threading.Event()
    errors: list[BaseException] = []

    def register() -> None:
        try:
            BookieRegistry(new).register("bookie-1", REG2)
            registered.set()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=register)
    thread.start()
    wait_until(lambda: _owner(new, "bookie-1") == old.session_id, what="old registration")
    assert not registered.is_set()
    old.close()  # the old session ends: its ephemeral znode goes, the new bookie takes over
    thread.join(timeout=15)
    assert registered.is_set(), errors
    assert _owner(new, "bookie-1") == new.session_id
    assert BookieRegistry(new).available() == {"bookie-1": REG2}


def test_register_gives_up_on_a_live_owner(connect: Callable[..., MetadataSession]) -> None:
    owner = connect()
    BookieRegistry(owner).register("bookie-1", REG1)
    other = connect(session_timeout_s=1.5)
    started = time.monotonic()
    with pytest.raises(MetadataError, match="bookie already registered") as info:
        BookieRegistry(other).register("bookie-1", REG2)
    assert 1.4 < time.monotonic() - started < 10
    assert info.value.context["bookie"] == "bookie-1"
    assert BookieRegistry(other).available() == {"bookie-1": REG1}


def test_watch_available_follows_changes(connect: Callable[..., MetadataSession]) -> None:
    watcher_session, bookie_session = connect(), connect()
    bookie = BookieRegistry(bookie_session)
    bookie.register("bookie-1", REG1)
    snapshots: list[dict[str, BookieRegistration]] = []
    BookieRegistry(watcher_session).watch_available(snapshots.append)
    assert snapshots == [{"bookie-1": REG1}]
    bookie.register("bookie-2", REG2)
    wait_until(lambda: snapshots[-1] == {"bookie-1": REG1, "bookie-2": REG2}, what="bookie-2")
    read_only = BookieRegistration(address=REG2.address, read_only=True)
    bookie.update("bookie-2", read_only)
    wait_until(lambda: snapshots[-1].get("bookie-2") == read_only, what="update")
    bookie.unregister("bookie-1")
    wait_until(lambda: snapshots[-1] == {"bookie-2": read_only}, what="bookie-1 gone")
    bookie_session.close()
    wait_until(lambda: snapshots[-1] == {}, what="all gone")
    # Every delivered snapshot was a real change.
    assert all(a != b for a, b in zip(snapshots, snapshots[1:], strict=False))


def test_reregisters_after_session_expiry(
    connect: Callable[..., MetadataSession], zk_hosts: str
) -> None:
    session, observer = connect(), connect()
    registry = BookieRegistry(session)
    registry.register("bookie-1", REG1)
    registry.register("bookie-2", REG2)
    registry.unregister("bookie-2")  # unregistered bookies are not restored
    events: list[SessionState] = []
    session.add_session_listener(events.append)
    snapshots: list[dict[str, BookieRegistration]] = []
    BookieRegistry(observer).watch_available(snapshots.append)

    old_id = expire_session(session, zk_hosts)
    wait_until(lambda: session.session_generation == 2, what="new session")
    new_id = session.session_id
    assert new_id not in (None, old_id)
    wait_until(lambda: _owner(observer, "bookie-1") == new_id, what="re-registration")
    assert BookieRegistry(observer).available() == {"bookie-1": REG1}
    assert SessionState.LOST in events
    # The observer's watch (which may or may not have caught the short gap) still works.
    wait_until(lambda: snapshots[-1] == {"bookie-1": REG1}, what="watch")
    registry.update("bookie-1", REG2)
    wait_until(lambda: snapshots[-1] == {"bookie-1": REG2}, what="update after expiry")


def test_cookies(session: MetadataSession) -> None:
    registry = BookieRegistry(session)
    assert registry.read_cookie("bookie-1") is None
    assert registry.write_cookie("bookie-1", b"cookie-a", None) == 0
    # A create retried after a lost reply finds its own data: done, not an error.
    assert registry.write_cookie("bookie-1", b"cookie-a", None) == 0
    with pytest.raises(MetadataError, match="another cookie"):
        registry.write_cookie("bookie-1", b"cookie-b", None)
    assert registry.read_cookie("bookie-1") == (b"cookie-a", 0)
    assert registry.write_cookie("bookie-1", b"cookie-b", 0) == 1
    # The same CAS again (its reply lost) finds its data one version on: done.
    assert registry.write_cookie("bookie-1", b"cookie-b", 0) == 1
    with pytest.raises(BadVersionError):
        registry.write_cookie("bookie-1", b"cookie-c", 0)
    with pytest.raises(BadVersionError):
        registry.delete_cookie("bookie-1", 0)
    assert registry.read_cookie("bookie-1") == (b"cookie-b", 1)
    registry.delete_cookie("bookie-1", 1)
    registry.delete_cookie("bookie-1", 1)  # already gone: fine
    assert registry.read_cookie("bookie-1") is None
    with pytest.raises(MetadataError, match="no cookie"):
        registry.write_cookie("bookie-1", b"x", 3)
