"""Fixtures of the retention tests: metadata sessions on a fresh chroot of the shared ZooKeeper
(those of tests/unit/metadata), a StreamStore, and streams built fragment by fragment."""

from __future__ import annotations

from tests.unit.metadata.conftest import connect, session, zk_hosts

__all__ = ["connect", "session", "zk_hosts"]
