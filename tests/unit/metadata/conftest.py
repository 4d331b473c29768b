"""Fixtures for the metadata tests: sessions on a fresh chroot of the shared ZooKeeper, forced
session expiry, and polling with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from kazoo.client import KazooClient

from stream.metadata import MetadataSession
from stream.sandbox.zookeeper import ZooKeeperServer

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout_s: float = 15.0, what: str = "") -> T:
    """Returns the first truthy value of `predicate()`, polled until `timeout_s`; fails the
    test when the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}")
        time.sleep(0.02)


def expire_session(session: MetadataSession, hosts: str) -> int:
    """Expires `session` on the server and returns its old session id: a second client attaches
    to the same session (id + password) and closes it, which ends it for good."""
    client_id = session.zk.client_id
    assert client_id is not None, "session not connected"
    other = KazooClient(hosts=hosts, client_id=client_id)
    other.start(timeout=10)
    other.stop()
    other.close()
    return int(client_id[0])


@pytest.fixture
def connect(metadata_root: str) -> Iterator[Callable[..., MetadataSession]]:
    """Returns a function opening sessions on the test's metadata root; closes them after."""
    sessions: list[MetadataSession] = []

    def open_session(**kwargs: float) -> MetadataSession:
        kwargs.setdefault("session_timeout_s", 6.0)
        session = MetadataSession.connect(metadata_root, **kwargs)
        sessions.append(session)
        return session

    yield open_session
    for session in sessions:
        session.close()


@pytest.fixture
def session(connect: Callable[..., MetadataSession]) -> MetadataSession:
    return connect()


@pytest.fixture
def zk_hosts(zookeeper: ZooKeeperServer) -> str:
    return zookeeper.hosts
