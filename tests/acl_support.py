"""Metadata auth for tests: auth files, kazoo clients as some identity, and the check that a
whole znode tree is closed to a client without the cluster's identity."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NotEmptyError
from kazoo.security import OPEN_ACL_UNSAFE

from stream.metadata import write_metadata_auth_file

CLUSTER_IDENTITY = "streamkeeper:cluster-secret"
READER_IDENTITY = "reader:reader-secret"


def write_auth_file(
    directory: Path,
    identity: str = CLUSTER_IDENTITY,
    *,
    read_identities: Sequence[str] = (),
    name: str = "",
    mode: int = 0o600,
) -> Path:
    """Returns the path of a new metadata auth file in `directory` with mode `mode`."""
    path = directory / (name or f"auth-{uuid.uuid4().hex[:8]}.toml")
    write_metadata_auth_file(path, identity, read_identities=tuple(read_identities))
    path.chmod(mode)
    return path


def fresh_root() -> str:
    """Returns a metadata root that does not exist yet, two levels deep: the project creates
    both levels, so both must get the ACL."""
    return f"/sk-acl-{uuid.uuid4().hex[:10]}/cluster"


def kazoo_client(hosts: str, identity: str | None = None) -> KazooClient:
    """Returns a started, unchrooted kazoo client authenticated as `identity` (none: anonymous)."""
    auth = None if identity is None else [("digest", identity)]
    zk = KazooClient(hosts=hosts, auth_data=auth)
    zk.start(timeout=10)
    return zk


def walk(zk: KazooClient, path: str) -> Iterator[str]:
    """Yields `path` and every znode below it (read with `zk`, which must be allowed to)."""
    yield path
    for child in zk.get_children(path):
        yield from walk(zk, f"{path}/{child}")


def assert_closed_to(outsider: KazooClient, nodes: Sequence[str]) -> None:
    """Fails unless `outsider` can neither read nor change any of `nodes`."""
    for node in nodes:
        for call, *args in (
            (outsider.get, node),
            (outsider.get_children, node),
            (outsider.set, node, b"forged"),
            (outsider.create, f"{node}/forged", b"x"),
            (outsider.set_acls, node, OPEN_ACL_UNSAFE),
        ):
            with pytest.raises(NoAuthError):
                call(*args)
        try:
            outsider.delete(node)
        except (NoAuthError, NotEmptyError):
            # NotEmpty: the deepest node the project created under a parent that is not its
            # own (the root's first level under "/") is guarded by having children.
            continue
        raise AssertionError(f"an outsider deleted {node}")
