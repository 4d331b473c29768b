"""ZooKeeper ACLs on a real cluster (bookie processes, the retention service process, the
bookies' auto-recovery, the client and streamctl), all with one metadata auth file: after a
workload of create, append, retention, re-replication of a killed bookie and seal, no znode
under the root can be read or changed without the cluster's identity; a read identity reads
(list, info, tail) but every write is refused at once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stream.client import StreamClient
from stream.errors import PermissionDeniedError
from stream.metadata import RetentionPolicy, StreamState
from stream.sandbox.cluster import SandboxCluster
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
from tests.integration.bookie_support import BookieFactory
from tests.integration.cli_support import streamctl
from tests.unit.metadata.conftest import wait_until

pytestmark = pytest.mark.integration

ENTRY = b"x" * 200


@pytest.fixture
def secured(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[SandboxCluster]:
    """Four bookies (auto-recovery on, a lost bookie re-replicated after 2 s) and a retention
    service, all authenticated with one auth file that also lets READER_IDENTITY read."""
    auth = write_auth_file(tmp_path, read_identities=[READER_IDENTITY], name="cluster.toml")
    with SandboxCluster(
        tmp_path / "cluster",
        bookies=4,
        root=fresh_root(),
        zookeeper=zookeeper,
        retention_interval_s=0.5,
        metadata_auth_file=auth,
        bookie_settings={
            "autorecovery": True,
            "lost_bookie_recovery_delay_ms": 2000,
            "open_stream_replication_delay_ms": 2000,
            "audit_interval_ms": 2000,
        },
    ) as cluster:
        yield cluster


def _ensembles(client: StreamClient, name: str) -> list[tuple[str, ...]]:
    return [tuple(f.ensemble) for f in client.stream_info(name).fragments]


def test_workload_leaves_no_znode_open_to_an_unauthenticated_client(
    secured: SandboxCluster,
) -> None:
    auth = secured.metadata_auth_file
    with StreamClient.connect(secured.metadata, metadata_auth_file=auth) as client:
        client.create_stream("orders", fragment_max_entries=10)
        with client.open_writer("orders") as writer:
            for _ in range(60):
                writer.append(ENTRY)
        # The retention service (its own process, its own session) trims.
        client.set_retention("orders", RetentionPolicy(max_bytes=4_000))
        wait_until(lambda: client.stream_info("orders").first_entry_id > 0, 60, "a trim")
        # The bookies' auditor and workers re-replicate a killed bookie's share.
        victim = next(b for b in secured.bookies if b.bookie_id in _ensembles(client, "orders")[-1])
        victim.kill9()
        wait_until(
            lambda: all(victim.bookie_id not in e for e in _ensembles(client, "orders")),
            90,
            "re-replication",
        )
        client.seal_stream("orders")
        assert client.stream_info("orders").state == StreamState.SEALED

    hosts, _, rest = secured.metadata.partition("/")
    admin = kazoo_client(hosts, CLUSTER_IDENTITY)
    outsider = kazoo_client(hosts)
    try:
        nodes = list(walk(admin, "/" + rest.split("/")[0]))
        assert any("/retention/" in n for n in nodes) and any("/auditor/" in n for n in nodes)
        assert_closed_to(outsider, nodes)
    finally:
        admin.stop()
        outsider.stop()


def test_read_identity_reads_but_writes_fail_at_once(
    secured: SandboxCluster, tmp_path: Path
) -> None:
    user = CLUSTER_IDENTITY.partition(":")[0]
    wrong = write_auth_file(tmp_path, f"{user}:wrong", name="wrong.toml")
    intruder = secured.add_bookie(
        "bookie-9", wait=False, settings={"metadata_auth_file": str(wrong)}
    )
    assert intruder.wait_exit(30) == 6  # streamctl's "denied"
    assert "wrong password" in intruder.log_tail(3)

    auth = secured.metadata_auth_file
    with StreamClient.connect(secured.metadata, metadata_auth_file=auth) as client:
        client.create_stream("orders")
        with client.open_writer("orders") as writer:
            for i in range(5):
                writer.append(b"entry-%d" % i)
    reader_auth = write_auth_file(tmp_path, READER_IDENTITY, name="reader.toml")
    with StreamClient.connect(secured.metadata, metadata_auth_file=reader_auth) as reader:
        assert reader.list_streams() == ["orders"]
        assert reader.stream_info("orders").lac == 4
        entries = reader.open_reader("orders").read(0, 4)
        assert [e.payload for e in entries] == [b"entry-%d" % i for i in range(5)]
        for write in (
            lambda: reader.create_stream("other"),
            lambda: reader.open_writer("orders"),
            lambda: reader.seal_stream("orders"),
            lambda: reader.set_retention("orders", RetentionPolicy(max_bytes=1)),
        ):
            with pytest.raises(PermissionDeniedError):
                write()
        assert reader.stream_info("orders").state == StreamState.OPEN

    as_reader = ("--metadata-auth-file", str(reader_auth))
    tail = streamctl(
        secured.metadata, *as_reader, "tail", "orders", "--from", "earliest", "--max-entries", "5"
    )
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout.split() == [f"entry-{i}" for i in range(5)]
    create = streamctl(secured.metadata, *as_reader, "create", "other", "--allow-fewer-bookies")
    # 6, not 4 (unavailable): refused as denied, not retried until a deadline.
    assert create.returncode == 6, create.stderr
    assert "PermissionDenied" in create.stderr or "refused" in create.stderr
    anonymous = streamctl(secured.metadata, "streams")
    assert anonymous.returncode == 6
    assert "metadata auth file" in anonymous.stderr
    listed = streamctl(secured.metadata, "--metadata-auth-file", str(auth), "streams")
    assert listed.returncode == 0 and "orders" in listed.stdout


def test_bookie_refuses_a_loose_auth_file(metadata_root: str, tmp_path: Path) -> None:
    loose = write_auth_file(tmp_path, mode=0o640)
    factory = BookieFactory(tmp_path, metadata_root)
    try:
        bookie = factory.create("bookie-1", metadata_auth_file=str(loose)).start()
        assert bookie.wait_exit(30) == 1
        tail = bookie.log_tail(3)
    finally:
        factory.stop_all()
    assert "metadata_auth_file" in tail and "chmod 600" in tail
