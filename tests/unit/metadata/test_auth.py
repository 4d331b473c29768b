"""The metadata auth file and ZooKeeper ACLs, on a real ZooKeeper: every znode the metadata layer
creates is closed to anyone without the cluster's identity, a read identity reads but cannot
write, and a wrong password or a loose file is refused with a clear error."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.security import Permissions

from stream.errors import ConfigError, PermissionDeniedError
from stream.metadata import (
    BookieRegistration,
    BookieRegistry,
    MetadataSession,
    StreamStore,
    WriterInfo,
    digest_id,
    load_metadata_auth,
    write_metadata_auth_file,
)
from stream.metadata.underreplication import LockInfo, Marker, UnderreplicationStore
from stream.retention.service import ELECTION_PATH
from stream.sandbox.zookeeper import ZooKeeperServer
from tests.acl_support import (
    CLUSTER_IDENTITY,
    READER_IDENTITY,
    assert_closed_to,
    fresh_root,
    kazoo_client,
    walk,
    write_auth_file,
)

STREAM_ARGS = {
    "ensemble": 3,
    "write_quorum": 3,
    "ack_quorum": 2,
    "fragment_max_entries": 100,
    "fragment_max_bytes": 1 << 20,
}


@pytest.fixture
def secured(zookeeper: ZooKeeperServer) -> str:
    """Returns the connect string of a metadata root that does not exist yet."""
    return zookeeper.connect_string(fresh_root())


@pytest.fixture
def open_as(secured: str, tmp_path: Path) -> Iterator[Callable[..., MetadataSession]]:
    """Returns a function opening sessions on `secured` with a given auth file; closes them."""
    sessions: list[MetadataSession] = []

    def open_session(auth_file: Path | None) -> MetadataSession:
        session = MetadataSession.connect(secured, session_timeout_s=6.0, auth_file=auth_file)
        sessions.append(session)
        return session

    yield open_session
    for session in sessions:
        session.close()


def _workload(session: MetadataSession) -> None:
    """Creates one znode of every kind the project makes: stream, writer, cookie, bookie
    registration, marker and its lock, draining flag, an election node, the instance id."""
    meta = StreamStore(session).create_stream("orders", **STREAM_ARGS)
    StreamStore(session).register_writer(meta.id, WriterInfo("w", "h", 1, 1))
    registry = BookieRegistry(session)
    registry.write_cookie("bookie-1", b"cookie", None)
    registry.register("bookie-1", BookieRegistration(address="127.0.0.1:3181"))
    under = UnderreplicationStore(session)
    marker = Marker(meta.id, 0, ("bookie-1",), "lost")
    under.mark(marker)
    assert under.try_lock(marker.name, LockInfo(owner="worker-1"))
    under.set_draining("bookie-1", True)
    lock = session.zk.Lock(ELECTION_PATH, "retention-1")
    assert lock.acquire(timeout=10)
    session.instance_id()


def test_every_znode_is_closed_to_an_unauthenticated_client(
    open_as: Callable[..., MetadataSession], secured: str, tmp_path: Path
) -> None:
    session = open_as(write_auth_file(tmp_path))
    _workload(session)
    hosts, _, rest = secured.partition("/")
    top = "/" + rest.split("/")[0]
    admin = kazoo_client(hosts, CLUSTER_IDENTITY)
    outsider = kazoo_client(hosts)
    try:
        nodes = list(walk(admin, top))
        # The layout, a stream's meta and writer, a cookie, an ephemeral registration, a lock,
        # an election node, the instance id: far more than the base layout.
        assert len(nodes) > 20
        assert_closed_to(outsider, nodes)
    finally:
        admin.stop()
        outsider.stop()


def test_acl_gives_all_to_the_cluster_and_read_to_readers(
    open_as: Callable[..., MetadataSession], secured: str, tmp_path: Path
) -> None:
    session = open_as(write_auth_file(tmp_path, read_identities=[READER_IDENTITY]))
    StreamStore(session).create_stream("orders", **STREAM_ARGS)
    acls, _ = session.zk.get_acls("/streams/by-name/orders")
    assert {(a.id.id, a.perms) for a in acls} == {
        (digest_id(CLUSTER_IDENTITY), Permissions.ALL),
        (digest_id(READER_IDENTITY), Permissions.READ),
    }


def test_read_identity_reads_but_every_write_is_denied(
    open_as: Callable[..., MetadataSession], tmp_path: Path
) -> None:
    cluster = open_as(write_auth_file(tmp_path, read_identities=[READER_IDENTITY]))
    StreamStore(cluster).create_stream("orders", **STREAM_ARGS)
    reader = open_as(write_auth_file(tmp_path, READER_IDENTITY))
    store = StreamStore(reader)
    meta, version = store.get_stream("orders")
    assert store.list_streams() == ["orders"]
    with pytest.raises(PermissionDeniedError):
        store.create_stream("other", **STREAM_ARGS)
    with pytest.raises(PermissionDeniedError):
        store.set_state(meta.id, version, "SEALED")
    with pytest.raises(PermissionDeniedError):
        BookieRegistry(reader).write_cookie("bookie-9", b"forged", None)
    assert StreamStore(cluster).list_streams() == ["orders"]


def test_wrong_password_or_no_auth_file_is_refused_at_connect(
    open_as: Callable[..., MetadataSession], tmp_path: Path
) -> None:
    open_as(write_auth_file(tmp_path))
    user = CLUSTER_IDENTITY.partition(":")[0]
    with pytest.raises(PermissionDeniedError, match="wrong password") as wrong:
        open_as(write_auth_file(tmp_path, f"{user}:not-the-password"))
    assert wrong.value.context["user"] == user
    with pytest.raises(PermissionDeniedError, match="metadata auth file"):
        open_as(None)


def test_loose_auth_file_is_refused(tmp_path: Path) -> None:
    for mode in (0o640, 0o604, 0o660):
        path = write_auth_file(tmp_path, mode=mode)
        with pytest.raises(ConfigError, match="chmod 600"):
            load_metadata_auth(path)
    assert load_metadata_auth(write_auth_file(tmp_path, mode=0o400)).user == "streamkeeper"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('identity = "a:b"\nextra = 1\n', "extra"),
        ('scheme = "sasl"\nidentity = "a:b"\n', "scheme"),
        ('identity = "s3cr3t-only"\n', "identity"),
        ('identity = ":s3cr3t-pw"\n', "identity"),
        ("", "identity"),
        ('identity = "a:b"\nread_identities = "r:pw"\n', "read_identities"),
        ('identity = "a:b"\nread_digests = ["r:not-base64!"]\n', "read_digests"),
    ],
)
def test_bad_auth_file_names_the_key_and_hides_the_password(
    tmp_path: Path, text: str, key: str
) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(ConfigError) as error:
        load_metadata_auth(path)
    assert key in str(error.value)
    assert "s3cr3t" not in str(error.value)


def test_read_digests_grant_read_without_the_readers_password(tmp_path: Path) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(
        f'identity = "{CLUSTER_IDENTITY}"\nread_digests = ["{digest_id(READER_IDENTITY)}"]\n'
    )
    path.chmod(0o600)
    auth = load_metadata_auth(path)
    assert (digest_id(READER_IDENTITY), Permissions.READ) in {
        (a.id.id, a.perms) for a in auth.acl()
    }
    assert "cluster-secret" not in repr(auth)


def test_auth_on_a_root_created_without_it_warns(
    metadata_root: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # `metadata_root` exists already, created open (world:anyone) like any root made before.
    with MetadataSession.connect(metadata_root, auth_file=write_auth_file(tmp_path)):
        pass
    assert "metadata.root_open_to_anyone" in caplog.text


def test_a_new_auth_file_is_private_random_and_never_overwritten(tmp_path: Path) -> None:
    first = write_metadata_auth_file(tmp_path / "a.toml", read_identities=(READER_IDENTITY,))
    assert first.stat().st_mode & 0o777 == 0o600
    auth = load_metadata_auth(first)
    assert auth.user == "streamkeeper" and auth.readers() == ["reader"]
    other = load_metadata_auth(write_metadata_auth_file(tmp_path / "b.toml"))
    assert other.identity != auth.identity
    with pytest.raises(ConfigError, match="exists"):
        write_metadata_auth_file(first, CLUSTER_IDENTITY)
    assert load_metadata_auth(first) == auth
