"""Helpers of the retention integration tests: clusters whose bookies collect garbage and
compact often on small entry logs, with the retention service running as a process; disk
usage as the file system counts it; polling with a deadline."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.zookeeper import ZooKeeperServer
from tests.integration.bookie_support import stop_cluster

T = TypeVar("T")
MIB = 1 << 20

# GC and compaction run often and entry logs rotate small, so that reclaimed space shows
# within seconds. 3 MiB logs hold 47 entries of 64 KiB: the size test's retention boundary
# (entry 704) is then the last entry of a log, which only compaction can free. The journal
# rotates small too: only whole journal files before the checkpoint are retired (two kept for
# reuse), so with the default 256 MiB file the journal alone would keep every byte of a 50 MiB
# test.
SMALL_BOOKIE_SETTINGS: dict[str, Any] = {
    "entry_log_size_limit_bytes": 3 * MIB,
    "max_entry_bytes": MIB,
    "journal_max_file_bytes": 4 * MIB,
    "flush_interval_ms": 200,
    "gc_interval_ms": 500,
    "compaction_interval_ms": 1000,
    "major_compaction_interval_ms": 2000,
}


def wait_until(predicate: Callable[[], T], timeout_s: float = 30.0, what: str = "") -> T:
    """Returns the first truthy value of `predicate()`, polled until `timeout_s`; fails the
    test when the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}")
        time.sleep(0.05)


def disk_bytes(path: Path) -> int:
    """Returns the bytes allocated on disk to the files under `path` (st_blocks, as `du`
    counts them: LMDB's sparse map file counts what it really uses)."""
    total = 0
    for item in path.rglob("*"):
        try:
            if item.is_file():
                total += item.stat().st_blocks * 512
        except FileNotFoundError:
            continue  # deleted by GC while we walked
    return total


def data_dirs(cluster: SandboxCluster, bookie_id: str) -> dict[str, int]:
    """Returns the allocated bytes of a bookie's `ledgers`, `journal` and `index` dirs."""
    data = cluster.bookie(bookie_id).data_dir / "data"
    return {name: disk_bytes(data / name) for name in ("ledgers", "journal", "index")}


def logged_events(path: Path, event: str) -> list[dict[str, Any]]:
    """Returns the JSON log lines of `event` in a process's log file."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        if f'"{event}"' in line and line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def payload(entry_id: int, size: int) -> bytes:
    """Returns a payload of `size` bytes that names its entry (checked on read)."""
    head = f"entry-{entry_id}:".encode()
    return (head * (size // len(head) + 1))[:size]


@contextlib.contextmanager
def cluster_maker(
    zookeeper: ZooKeeperServer, tmp_path: Path
) -> Iterator[Callable[..., SandboxCluster]]:
    """Yields `make(bookies=3, retention_interval_s=0.5, **bookie_settings)`: a started cluster
    on its own metadata root running the retention service process; every cluster made is
    stopped on exit (a test module's fixture wraps this)."""
    made: list[SandboxCluster] = []

    def make(
        bookies: int = 3, retention_interval_s: float = 0.5, **settings: Any
    ) -> SandboxCluster:
        cluster = SandboxCluster(
            tmp_path / f"cluster-{len(made)}",
            bookies=bookies,
            root=f"/streamkeeper-{uuid.uuid4().hex[:12]}",
            zookeeper=zookeeper,
            bookie_settings=settings,
            retention_interval_s=retention_interval_s,
        )
        made.append(cluster)
        return cluster.start()

    try:
        yield make
    finally:
        for cluster in made:
            stop_cluster(cluster)
