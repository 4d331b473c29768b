"""The simulated ZooKeeper: kazoo's semantics and errors (checked against a real ZooKeeper),
the REAL StreamStore and BookieRegistry running on it, session expiry and lost replies."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import ZnodeStat
from kazoo.recipe.lock import Lock

from stream.errors import InvalidTermError
from stream.metadata import BadVersionError, Fragment, StreamStore, WriterInfo, paths
from stream.metadata.bookies import BookieRegistration, BookieRegistry
from stream.metadata.connection import MetadataSession, MetadataSessionExpiredError
from stream.metadata.election import LeaderElection
from stream.sandbox.zookeeper import ZooKeeperServer
from stream.sim.zookeeper import FakeKazooClient, FakeZooKeeper, SimMetadataSession
from tests.unit.metadata.conftest import expire_session

E3 = ("b1", "b2", "b3")


def _normal(value: Any) -> Any:
    """Returns what a kazoo call returned, stripped of zxids and times (they differ)."""
    if isinstance(value, ZnodeStat):
        return ("stat", value.version, value.numChildren, value.dataLength, value.cversion)
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], ZnodeStat):
        return (value[0], _normal(value[1]))
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, BaseException):
        return type(value).__name__
    return value


def _script(zk: Any) -> list[tuple[str, Any]]:
    """Runs one sequence of kazoo calls; returns (step, normalized result or error name)."""
    out: list[tuple[str, Any]] = []

    def do(step: str, call: Callable[[], Any]) -> None:
        try:
            out.append((step, _normal(call())))
        except Exception as e:
            out.append((step, type(e).__name__))

    do("create", lambda: zk.create("/a", b"1"))
    do("create again", lambda: zk.create("/a", b"2"))
    do("create without parent", lambda: zk.create("/x/y", b""))
    do("create child", lambda: zk.create("/a/b", b"c"))
    do("get", lambda: zk.get("/a"))
    do("set at version 0", lambda: zk.set("/a", b"2", 0))
    do("set at version 0 again", lambda: zk.set("/a", b"3", 0))
    do("delete non-empty", lambda: zk.delete("/a"))
    do("delete at wrong version", lambda: zk.delete("/a/b", 7))
    do("sequence 1", lambda: zk.create("/a/s-", b"", sequence=True))
    do("sequence 2", lambda: zk.create("/a/s-", b"", sequence=True))
    do("children", lambda: sorted(zk.get_children("/a")))
    do("ephemeral", lambda: zk.create("/e", b"", ephemeral=True))
    do("child of an ephemeral", lambda: zk.create("/e/c", b""))
    do("exists", lambda: zk.exists("/a"))
    do("exists absent", lambda: zk.exists("/nope"))

    failing = zk.transaction()
    failing.create("/t1", b"")
    failing.set_data("/a", b"x", 99)
    failing.create("/t2", b"")
    do("failed multi", failing.commit)
    do("failed multi left nothing", lambda: zk.exists("/t1"))

    ok = zk.transaction()
    ok.check("/a", 1)
    ok.set_data("/a", b"y", 1)
    ok.delete("/a/b")
    ok.create("/t3", b"z")
    do("multi", ok.commit)
    do("after multi", lambda: zk.get("/a"))
    do("children after multi", lambda: sorted(zk.get_children("/a")))
    do("delete", lambda: zk.delete("/t3"))
    do("delete absent", lambda: zk.delete("/t3"))
    return out


def test_fake_runs_the_script() -> None:
    got = dict(_script(FakeKazooClient(FakeZooKeeper())))
    assert got["create again"] == "NodeExistsError"
    assert got["create without parent"] == "NoNodeError"
    assert got["set at version 0 again"] == "BadVersionError"
    assert got["delete non-empty"] == "NotEmptyError"
    assert got["sequence 1"] == "/a/s-0000000001"
    assert got["child of an ephemeral"] == "NoChildrenForEphemeralsError"
    assert got["failed multi"] == ["RolledBackError", "BadVersionError", "RuntimeInconsistency"]
    assert got["failed multi left nothing"] is None
    assert got["after multi"] == (b"y", ("stat", 2, 2, 1, 4))


@pytest.mark.integration
def test_fake_behaves_as_a_real_zookeeper(metadata_root: str) -> None:
    real = KazooClient(hosts=metadata_root)
    real.start(timeout=10)
    try:
        expected = _script(real)
    finally:
        real.stop()
        real.close()
    assert _script(FakeKazooClient(FakeZooKeeper())) == expected


def _session(server: FakeZooKeeper, now: Callable[[], float] = lambda: 0.0) -> SimMetadataSession:
    return SimMetadataSession(FakeKazooClient(server, now=now))


def _layout(server: FakeZooKeeper) -> None:
    admin = FakeKazooClient(server)
    for path in paths.BASE_LAYOUT:
        admin.ensure_path(path)
    admin.create(paths.STREAMS_NEXT_ID, b"1")


def _stream(store: StreamStore) -> int:
    return store.create_stream("s", 3, 3, 2, 10, 1 << 20).id


def test_real_stream_store_takeover_race_has_one_winner() -> None:
    server = FakeZooKeeper()
    _layout(server)
    one, two = StreamStore(_session(server)), StreamStore(_session(server))
    stream_id = _stream(one)
    _, version = two.get_stream("s")
    meta, after, last = one.begin_takeover(stream_id, version)
    assert meta.term == 1 and last is None
    with pytest.raises(BadVersionError):
        two.begin_takeover(stream_id, version)
    fragment = Fragment(0, E3, created_ms=1)
    meta, after = one.finish_recovery(stream_id, after, 1, [], [fragment], 0)
    assert meta.term_history == ((1, 0),)
    with pytest.raises(InvalidTermError):
        meta2, v2, _ = two.begin_takeover(stream_id, after)
        one.finish_recovery(stream_id, v2, 1, [], [], 0)
    assert two.get_snapshot(stream_id)[0].term == 2


def test_lost_reply_of_a_multi_is_settled_by_the_op_id() -> None:
    server = FakeZooKeeper()
    _layout(server)
    lost = [2]  # the next two multi-ops land but their replies are lost

    def lose(kind: str) -> bool:
        if kind == "multi" and lost[0]:
            lost[0] -= 1
            return True
        return False

    session = SimMetadataSession(FakeKazooClient(server, lose_reply=lose))
    store = StreamStore(session)
    stream_id = _stream(store)  # the create's reply was lost: found by name, not duplicated
    assert StreamStore(_session(server)).list_streams() == ["s"]
    _, version = store.get_stream("s")
    meta, after, _ = store.begin_takeover(stream_id, version)
    assert meta.term == 1 and after == version + 1  # applied once, settled


def test_session_expiry_drops_ephemerals_and_reconnects_later() -> None:
    server = FakeZooKeeper()
    _layout(server)
    clock = [0.0]
    session = _session(server, now=lambda: clock[0])
    store = StreamStore(session)
    stream_id = _stream(store)
    store.register_writer(stream_id, WriterInfo("w", "h", 1, 1))
    registry = BookieRegistry(session)  # type: ignore[arg-type]
    registry.register("b1", BookieRegistration("b1:1"))
    assert store.writer_alive(stream_id) and "b1" in registry.available()
    generation = session.session_generation
    session.zk.expire(reconnect_after_s=1.0)
    assert server.exists(paths.stream_writer(stream_id)) is None
    with pytest.raises(MetadataSessionExpiredError):
        store.get_stream("s")
    clock[0] = 1.0
    assert store.get_stream("s")[0].id == stream_id  # a new session
    assert session.session_generation == generation + 1
    # The registry restored its registration on the new session, as after a real expiry.
    assert "b1" in registry.available()
    assert not store.writer_alive(stream_id)


ELECTION = "/election"


async def _until(predicate: Callable[[], object], timeout_s: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {predicate}"
        await asyncio.sleep(0.01)


async def _election_script(
    sessions: list[Any], admin: Any, expire: Callable[[Any], None]
) -> list[tuple[str, Any]]:
    """Runs `LeaderElection`s on `sessions` beside a candidate of an older release (kazoo's
    `Lock` on `admin`); returns what each step saw."""
    out: list[tuple[str, Any]] = []
    one, two = (
        LeaderElection(s, ELECTION, name, events="test", rng=random.Random(i))
        for i, (s, name) in enumerate(zip(sessions, ("one", "two"), strict=True))
    )

    def line() -> int:
        return len(admin.get_children(ELECTION))

    async def contend(election: LeaderElection) -> bool:
        # As the services do: a failed attempt (a session ending meanwhile) is tried again.
        while not election.cancelled:
            if await election.campaign():
                return True
        return False

    old = Lock(admin, ELECTION, "old")
    out.append(("old release leads", (old.acquire(blocking=False),)))
    first = asyncio.ensure_future(one.campaign())
    await _until(lambda: line() == 2)
    out.append(("one waits behind it", (first.done(), Lock(admin, ELECTION).contenders())))
    old.release()
    out.append(("one leads once it goes", (await asyncio.wait_for(first, 15), one.leading)))
    second = asyncio.ensure_future(two.campaign())
    await _until(lambda: line() == 2)
    out.append(("two waits", (second.done(), await one.holds(), await two.holds())))
    expire(sessions[0])
    out.append(("two leads when one's session ends", (await asyncio.wait_for(second, 15),)))
    await _until(lambda: not one.leading)
    out.append(("one does not", (one.leading, await one.holds(), two.leading)))
    again = asyncio.ensure_future(contend(one))
    await _until(lambda: line() == 2)
    one.cancel()
    out.append(("a cancelled campaign", (await asyncio.wait_for(again, 15),)))
    await _until(lambda: line() == 1)
    await two.resign()
    out.append(("resigned", (two.leading, line())))
    return out


async def _election_on_the_fake() -> list[tuple[str, Any]]:
    server = FakeZooKeeper(schedule=asyncio.get_running_loop().call_soon)
    admin = FakeKazooClient(server)
    admin.ensure_path(ELECTION)
    return await _election_script(
        [_session(server), _session(server)], admin, lambda s: s.zk.expire(0.0)
    )


def test_election_on_the_fake() -> None:
    got = dict(asyncio.run(_election_on_the_fake()))
    assert got["one waits behind it"] == (False, ["old", "one"])
    assert got["one leads once it goes"] == (True, True)
    assert got["two waits"] == (False, True, False)
    assert got["two leads when one's session ends"] == (True,)
    assert got["one does not"] == (False, False, True)
    assert got["a cancelled campaign"] == (False,)
    assert got["resigned"] == (False, 0)


@pytest.mark.integration
def test_election_on_the_fake_as_on_a_real_zookeeper(
    metadata_root: str, zookeeper: ZooKeeperServer
) -> None:
    sessions = [MetadataSession.connect(metadata_root, session_timeout_s=6.0) for _ in range(2)]
    admin = KazooClient(hosts=metadata_root)
    admin.start(timeout=10)
    try:
        admin.ensure_path(ELECTION)
        expected = asyncio.run(
            _election_script(sessions, admin, lambda s: expire_session(s, zookeeper.hosts))
        )
    finally:
        admin.stop()
        admin.close()
        for session in sessions:
            session.close()

    assert asyncio.run(_election_on_the_fake()) == expected
