"""Helpers for the storage engine tests: configs in tmp_path, entries with valid checksums,
waiting on durability futures with deadlines, and crash-restart."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from stream.bookie.config import BookieConfig
from stream.bookie.storage import ReplayReport, StreamStorage
from stream.protocol.checksum import entry_checksum
from stream.wire import bookie_pb2 as pb

TIMEOUT_S = 10.0
TIMESTAMP_MS = 1_700_000_000_000


def make_config(data_dir: Path, **overrides: Any) -> BookieConfig:
    """Returns a test config: no timer-driven flush, GC or compaction unless asked for."""
    values: dict[str, Any] = {
        "bookie_id": "b1",
        "listen": "127.0.0.1:1",
        "metadata": "127.0.0.1:2181/x",
        "data_dir": str(data_dir),
        "flush_interval_ms": 3_600_000,
        "gc_interval_ms": 3_600_000,
        "compaction_interval_ms": 3_600_000,
        "major_compaction_interval_ms": 3_600_000,
        "max_entry_bytes": 64 << 10,
        "entry_log_size_limit_bytes": 1 << 20,
        "journal_max_group_wait_ms": 0.0,
    }
    values.update(overrides)
    return BookieConfig(**values)


def entry(
    stream_id: int,
    entry_id: int,
    payload: bytes | None = None,
    *,
    flags: int = 0,
    timestamp_ms: int = TIMESTAMP_MS,
) -> pb.Entry:
    """Returns an entry with a valid checksum (payload defaults to one naming the entry)."""
    if payload is None:
        payload = f"stream {stream_id} entry {entry_id}".encode()
    return pb.Entry(
        entry_id=entry_id,
        flags=flags,
        timestamp_ms=timestamp_ms,
        payload=payload,
        crc32c=entry_checksum(stream_id, entry_id, flags, timestamp_ms, payload),
    )


def add_request(
    stream_id: int,
    term: int,
    entries: Iterable[pb.Entry],
    *,
    lac: int = -1,
    lafr: int = -1,
    recovery: bool = False,
) -> pb.AddRequest:
    """Returns an AddRequest, parsed back from bytes as the gRPC layer hands it over."""
    request = pb.AddRequest(stream_id=stream_id, term=term, lac=lac, lafr=lafr, recovery=recovery)
    request.entries.extend(entries)
    return pb.AddRequest.FromString(request.SerializeToString())


def wait(fut: Future[Any] | None, timeout: float = TIMEOUT_S) -> Any:
    """Returns the future's result (None for no future), failing after `timeout`."""
    if fut is None:
        return None
    return fut.result(timeout=timeout)


def wait_until(condition: Callable[[], bool], timeout: float = TIMEOUT_S) -> None:
    """Polls `condition` until it holds; fails the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.005)


def open_storage(config: BookieConfig) -> tuple[StreamStorage, ReplayReport]:
    """Returns an opened storage and its replay report."""
    storage = StreamStorage(config)
    report = storage.open()
    return storage, report


def crash_and_reopen(
    storage: StreamStorage, config: BookieConfig
) -> tuple[StreamStorage, ReplayReport]:
    """Abandons `storage` as a kill -9 would and opens the same directories again."""
    storage.abandon()
    return open_storage(config)


def flush(storage: StreamStorage) -> None:
    """Flushes the write cache to entry logs and the index, waiting for it."""
    wait(storage.request_flush())


def files(path: Path, prefix: str) -> list[Path]:
    """Returns the files under `path` whose name starts with `prefix`, sorted."""
    return sorted(p for p in path.iterdir() if p.name.startswith(prefix))


def dir_size(path: Path) -> int:
    """Returns the total size of the files directly under `path`."""
    return sum(os.path.getsize(p) for p in path.iterdir() if p.is_file())
