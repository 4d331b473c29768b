"""Connect-string parsing (pure) and MetadataSession against a real ZooKeeper."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, SessionExpiredError

from stream.errors import InvalidArgumentError, MetadataError
from stream.metadata import (
    MetadataSession,
    MetadataSessionExpiredError,
    SessionState,
    connection,
    parse_connect_string,
)
from stream.sandbox.ports import free_port
from stream.sandbox.zookeeper import ZooKeeperServer
from tests.unit.metadata.conftest import expire_session, wait_until


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:2181/streamkeeper", ("127.0.0.1:2181", "/streamkeeper")),
        ("127.0.0.1:2181", ("127.0.0.1:2181", "/streamkeeper")),
        ("zk1:2181,zk2:2182,zk3/prod/sk", ("zk1:2181,zk2:2182,zk3", "/prod/sk")),
        ("[::1]:2181/a.b-c_d", ("[::1]:2181", "/a.b-c_d")),
        ("  localhost:2181/x  ", ("localhost:2181", "/x")),
    ],
)
def test_parse_connect_string_accepts(text: str, expected: tuple[str, str]) -> None:
    assert parse_connect_string(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "/streamkeeper",
        "host:0",
        "host:65536",
        "host:port",
        "host:21 81",
        "host:２１８１",
        "a,,b:2181",
        "host:2181/",
        "host:2181//x",
        "host:2181/a//b",
        "host:2181/a/",
        "host:2181/a/../b",
        "host:2181/.",
        "host:2181/zookeeper",
        "host:2181/zookeeper/x",
        "host:2181/with space",
        "-bad-:2181",
        "[::1:2181",
        "[nothex]:2181",
        "[::1]x:2181",
        "host:2181:2182",
    ],
)
def test_parse_connect_string_refuses_junk(text: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_connect_string(text)


def test_parse_connect_string_refuses_non_str() -> None:
    with pytest.raises(InvalidArgumentError):
        parse_connect_string(None)  # type: ignore[arg-type]


_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
_host = st.one_of(
    st.lists(_label, min_size=1, max_size=4).map(".".join),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
)
_host_port = st.tuples(_host, st.one_of(st.none(), st.integers(1, 65535))).map(
    lambda hp: hp[0] if hp[1] is None else f"{hp[0]}:{hp[1]}"
)
_segment = st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True).filter(
    lambda s: s not in (".", "..", "zookeeper")
)


@given(
    hosts=st.lists(_host_port, min_size=1, max_size=4).map(",".join),
    root=st.one_of(st.none(), st.lists(_segment, min_size=1, max_size=4)),
)
def test_parse_connect_string_round_trips(hosts: str, root: list[str] | None) -> None:
    text = hosts if root is None else hosts + "/" + "/".join(root)
    expected_root = "/streamkeeper" if root is None else "/" + "/".join(root)
    assert parse_connect_string(text) == (hosts, expected_root)


@given(st.text(max_size=60))
def test_parse_connect_string_fails_only_with_invalid_argument(text: str) -> None:
    try:
        hosts, root = parse_connect_string(text)
    except InvalidArgumentError:
        return
    assert hosts and root.startswith("/")
    assert "/" not in hosts


# ---------------------------------------------------------------- against ZooKeeper


@pytest.mark.integration
def test_connect_creates_missing_root_and_layout(zookeeper: ZooKeeperServer) -> None:
    root = f"/sk-test-{uuid.uuid4().hex[:8]}/nested/deeper"
    with MetadataSession.connect(zookeeper.connect_string(root)) as session:
        for path in ("/streams/by-name", "/bookies/available", "/bookies/cookies"):
            assert session.zk.exists(path) is not None
        assert session.zk.exists("/underreplicated") is not None
        assert session.zk.get("/streams/next-id")[0] == b"1"
        assert session.session_generation == 1
        assert session.session_id is not None
    raw = KazooClient(hosts=zookeeper.hosts)
    raw.start(timeout=10)
    try:
        assert raw.exists(root + "/streams/by-name") is not None
    finally:
        raw.stop()
        raw.close()


@pytest.mark.integration
def test_connect_to_an_existing_layout_is_one_session_and_writes_nothing(
    metadata_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every client, tool and Spark query's driver connects: to an existing root and layout
    that is one ZooKeeper session (no second, unchrooted one to create the root) and one
    round of `exists`, no `ensure_path` per znode. A znode missing from the layout is still
    created."""
    MetadataSession.connect(metadata_root).close()  # the layout exists from here on
    ensured: list[str] = []
    real_ensure_path = KazooClient.ensure_path

    def recording_ensure_path(self: KazooClient, path: str, *args: object) -> bool:
        ensured.append(path)
        return bool(real_ensure_path(self, path, *args))

    def no_root_session(*args: object, **kwargs: object) -> None:
        raise AssertionError("a second session to create a root that exists")

    monkeypatch.setattr(KazooClient, "ensure_path", recording_ensure_path)
    monkeypatch.setattr(connection, "_ensure_root", no_root_session)
    with MetadataSession.connect(metadata_root) as session:
        assert ensured == []
        session.zk.delete("/bookies/draining")
    with MetadataSession.connect(metadata_root) as session:
        assert "/bookies/draining" in ensured
        assert session.zk.exists("/bookies/draining") is not None


@pytest.mark.integration
def test_connect_to_nothing_raises_metadata_error() -> None:
    with pytest.raises(MetadataError, match="cannot connect"):
        MetadataSession.connect(f"127.0.0.1:{free_port()}/sk", timeout_s=1, session_timeout_s=2)


@pytest.mark.integration
def test_instance_id_is_created_once(connect: Callable[..., MetadataSession]) -> None:
    sessions = [connect() for _ in range(4)]
    ids: list[str] = []
    barrier = threading.Barrier(len(sessions))

    def first_use(s: MetadataSession) -> None:
        barrier.wait()
        ids.append(s.instance_id())

    threads = [threading.Thread(target=first_use, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(ids) == 4 and len(set(ids)) == 1
    assert uuid.UUID(ids[0]).version == 4
    assert connect().instance_id() == ids[0]


@pytest.mark.integration
def test_retry_never_hides_session_expiry(session: MetadataSession) -> None:
    calls = []

    def expired() -> None:
        calls.append(1)
        raise SessionExpiredError()

    with pytest.raises(MetadataSessionExpiredError):
        session.retry(expired)
    assert len(calls) == 1


@pytest.mark.integration
def test_retry_gives_up_at_its_deadline(connect: Callable[..., MetadataSession]) -> None:
    session = connect(retry_deadline_s=0.5)
    calls = []

    def lossy() -> None:
        calls.append(1)
        raise ConnectionLoss()

    with pytest.raises(MetadataError, match="did not answer in time"):
        session.retry(lossy)
    assert len(calls) >= 2

    flaky = iter([ConnectionLoss(), ConnectionLoss(), None])

    def recovers() -> str:
        error = next(flaky)
        if error is not None:
            raise error
        return "ok"

    assert session.retry(recovers) == "ok"


@pytest.mark.integration
def test_session_expiry_moves_the_generation(session: MetadataSession, zk_hosts: str) -> None:
    events: list[SessionState] = []
    session.add_session_listener(events.append)
    old_id = expire_session(session, zk_hosts)
    wait_until(lambda: session.session_generation == 2, what="a new session")
    assert session.session_id not in (None, old_id)
    wait_until(lambda: SessionState.CONNECTED in events, what="CONNECTED event")
    assert SessionState.LOST in events
    last_connected = max(i for i, e in enumerate(events) if e is SessionState.CONNECTED)
    assert events.index(SessionState.LOST) < last_connected
    # The new session works.
    assert session.zk.exists("/streams") is not None


@pytest.mark.integration
def test_close_is_idempotent_and_final(connect: Callable[..., MetadataSession]) -> None:
    session = connect()
    session.close()
    session.close()
    assert session.closed
    with pytest.raises(MetadataError):
        session.retry(session.zk.exists, "/streams")
