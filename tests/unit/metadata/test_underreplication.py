"""Under-replication markers, their locks and the draining set on a real ZooKeeper."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stream.errors import InvalidArgumentError, MetadataError
from stream.metadata import MetadataSession
from stream.metadata.underreplication import LockInfo, Marker, UnderreplicationStore

from .conftest import expire_session, wait_until


def test_marks_merge_bookies_and_unmark_checks_the_version(
    connect: Callable[..., MetadataSession],
) -> None:
    store = UnderreplicationStore(connect())
    assert store.mark(Marker(7, 100, ("b1",), "lost", 5))
    assert not store.mark(Marker(7, 100, ("b1",), "lost", 6))  # nothing new
    assert store.mark(Marker(7, 100, ("b2",), "draining", 7))
    marker, version = store.marker_with_version("7-00000000000000000100") or (None, -1)
    assert marker is not None and marker.bookies == ("b1", "b2")
    assert store.mark(Marker(7, 100, ("b3",), "lost"))  # moved on meanwhile
    assert not store.unmark(marker.name, version)  # a stale version keeps the marker
    assert [m.name for m in store.markers()] == [marker.name]
    assert store.unmark(marker.name)
    assert store.markers() == []


def test_a_lock_has_one_holder_and_goes_with_its_session(
    connect: Callable[..., MetadataSession], zk_hosts: str
) -> None:
    one, two = connect(), connect()
    a, b = UnderreplicationStore(one), UnderreplicationStore(two)
    assert a.try_lock("m", LockInfo("one"))
    assert not b.try_lock("m", LockInfo("two"))
    a.update_lock("m", LockInfo("one", copied_entries=5, copied_bytes=50, target="b9"))
    assert b.lock_info("m") == LockInfo("one", 5, 50, "b9")
    expire_session(one, zk_hosts)
    wait_until(lambda: b.lock_info("m") is None, what="the expired session's lock to go")
    assert b.try_lock("m", LockInfo("two"))
    b.unlock("m")
    assert b.lock_info("m") is None


def test_draining_set_and_watch(connect: Callable[..., MetadataSession]) -> None:
    store = UnderreplicationStore(connect())
    seen: list[list[str]] = []
    handle = store.watch_draining(lambda ids: seen.append(sorted(ids)))
    store.set_draining("bookie-2", True)
    store.set_draining("bookie-2", True)  # idempotent
    assert store.draining() == {"bookie-2"}
    wait_until(lambda: seen and seen[-1] == ["bookie-2"], what="the watch")
    store.set_draining("bookie-2", False)
    assert store.draining() == set()
    handle.stop()


def test_nonsense_markers_are_refused() -> None:
    for bad in (
        dict(stream_id=0, first_entry_id=0, bookies=("b",), reason="lost"),
        dict(stream_id=1, first_entry_id=-1, bookies=("b",), reason="lost"),
        dict(stream_id=1, first_entry_id=0, bookies=(), reason="lost"),
        dict(stream_id=1, first_entry_id=0, bookies=("b",), reason="boredom"),
        dict(stream_id=1, first_entry_id=0, bookies=("no/slash",), reason="lost"),
    ):
        with pytest.raises(InvalidArgumentError):
            Marker(**bad)  # type: ignore[arg-type]
    with pytest.raises(MetadataError):
        Marker.from_json(b"{not json")
