"""GC deletes entry logs without live entries; compaction rewrites sparse logs, gives the disk
space back and keeps every live entry readable (also across a restart)."""

from __future__ import annotations

import os
import random
from pathlib import Path

from stream.wire import bookie_pb2 as pb

from .storage_support import (
    add_request,
    dir_size,
    entry,
    files,
    flush,
    make_config,
    open_storage,
    wait,
    wait_until,
)

ENTRY_BYTES = 4000


def _fill(storage, stream_id: int, first: int, count: int) -> dict[int, pb.Entry]:
    """Adds `count` entries of ENTRY_BYTES from `first` in batches of 10, flushing after
    each batch; returns them by id."""
    written = {}
    for start in range(first, first + count, 10):
        entries = [entry(stream_id, i, os.urandom(ENTRY_BYTES)) for i in range(start, start + 10)]
        wait(storage.add_batch(add_request(stream_id, 1, entries)).durable)
        written.update({e.entry_id: e for e in entries})
        flush(storage)
    return written


def test_gc_deletes_logs_whose_entries_were_all_trimmed(tmp_path: Path) -> None:
    config = make_config(tmp_path, entry_log_size_limit_bytes=128 << 10)
    storage, _ = open_storage(config)
    try:
        written = _fill(storage, 7, 0, 200)  # ~800 KB: several rotated logs
        logs_before = files(config.ledger_path, "entrylog-")
        assert len(logs_before) >= 5
        size_before = dir_size(config.ledger_path)
        wait(storage.trim(7, 150).durable)
        report = storage.gc_once()
        assert report.deleted_logs >= 3
        assert report.trimmed_entries == 150
        logs_after = files(config.ledger_path, "entrylog-")
        assert len(logs_after) == len(logs_before) - report.deleted_logs
        assert logs_before[0] not in logs_after  # the oldest held only trimmed entries
        assert dir_size(config.ledger_path) <= size_before - report.freed_bytes
        assert report.freed_bytes > 3 * 100_000
        for entry_id in range(150, 200):
            assert storage.read(7, entry_id).entry == written[entry_id]
        # Nothing left to do on a second round.
        assert storage.gc_once().deleted_logs == 0
    finally:
        storage.close()


def test_gc_deletes_logs_emptied_by_truncation_but_never_the_current(tmp_path: Path) -> None:
    config = make_config(tmp_path, entry_log_size_limit_bytes=128 << 10)
    storage, _ = open_storage(config)
    try:
        _fill(storage, 7, 0, 100)
        wait(storage.truncate(7, 2, -1).durable)
        report = storage.gc_once()
        remaining = files(config.ledger_path, "entrylog-")
        assert report.deleted_logs >= 2
        # The current log stays even though it holds nothing live.
        assert len(remaining) == 1
        assert storage.stats()["index_entries"] == 0
    finally:
        storage.close()


def test_compaction_shrinks_disk_usage_and_entries_stay_readable(tmp_path: Path) -> None:
    config = make_config(tmp_path, entry_log_size_limit_bytes=128 << 10)
    storage, _ = open_storage(config)
    stream_7 = _fill(storage, 7, 0, 150)
    stream_8 = _fill(storage, 8, 0, 50)
    # Make every log sparse: overwrite 3 of every 4 entries of stream 7 with tiny versions
    # (recovery write-back may overwrite) and trim most of stream 8.
    wait(storage.trim(8, 40).durable)
    for start in range(0, 150, 10):
        tiny = [entry(7, i, b"t") for i in range(start, start + 10) if i % 4]
        wait(storage.add_batch(add_request(7, 1, tiny)).durable)
        stream_7.update({e.entry_id: e for e in tiny})
    flush(storage)
    size_before = dir_size(config.ledger_path)
    logs_before = files(config.ledger_path, "entrylog-")
    report = storage.compact_once(0.5)
    assert report.compacted_logs >= 3
    assert report.moved_entries > 0
    assert dir_size(config.ledger_path) < size_before * 0.6
    assert len(files(config.ledger_path, "entrylog-")) < len(logs_before)
    for entry_id, e in stream_7.items():
        assert storage.read(7, entry_id).entry == e
    for entry_id in range(40, 50):
        assert storage.read(8, entry_id).entry == stream_8[entry_id]
    storage.close()
    storage, _ = open_storage(config)
    try:
        for entry_id, e in stream_7.items():
            assert storage.read(7, entry_id).entry == e
        for entry_id in range(40, 50):
            assert storage.read(8, entry_id).entry == stream_8[entry_id]
        assert storage.read(8, 39).code == pb.TRIMMED
    finally:
        storage.close()


def test_compaction_loses_to_a_concurrent_overwrite(tmp_path: Path) -> None:
    config = make_config(tmp_path, entry_log_size_limit_bytes=128 << 10)
    storage, _ = open_storage(config)
    try:
        _fill(storage, 7, 0, 100)
        wait(storage.trim(7, 95).durable)
        # Entry 97 is rewritten and flushed while compaction has not run yet; compaction
        # must keep pointing at the new version.
        wait(storage.add_batch(add_request(7, 1, [entry(7, 97, b"rewritten")])).durable)
        flush(storage)
        storage.compact_once(0.9)
        assert storage.read(7, 97).entry.payload == b"rewritten"
        assert all(storage.read(7, i).code == pb.OK for i in range(95, 100))
    finally:
        storage.close()


def test_compaction_threshold_zero_does_nothing(tmp_path: Path) -> None:
    config = make_config(tmp_path, entry_log_size_limit_bytes=128 << 10)
    storage, _ = open_storage(config)
    try:
        _fill(storage, 7, 0, 100)
        wait(storage.trim(7, 90).durable)
        report = storage.compact_once(0.0)
        assert (report.compacted_logs, report.deleted_logs) == (0, 0)
    finally:
        storage.close()


def test_gc_and_compaction_run_on_their_timers(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        entry_log_size_limit_bytes=128 << 10,
        gc_interval_ms=50,
        compaction_interval_ms=50,
        minor_compaction_threshold=0.5,
    )
    storage, _ = open_storage(config)
    try:
        _fill(storage, 7, 0, 100)
        logs = len(files(config.ledger_path, "entrylog-"))
        wait(storage.trim(7, 95).durable)
        wait_until(lambda: len(files(config.ledger_path, "entrylog-")) < logs - 1)
        for entry_id in range(95, 100):
            assert storage.read(7, entry_id).code == pb.OK
    finally:
        storage.close()


def test_gc_never_deletes_logs_of_a_flush_not_yet_in_the_index(tmp_path: Path) -> None:
    config = make_config(tmp_path, entry_log_size_limit_bytes=128 << 10)
    storage, _ = open_storage(config)
    try:
        entries = [entry(7, i, os.urandom(ENTRY_BYTES)) for i in range(100)]
        wait(storage.add_batch(add_request(7, 1, entries)).durable)
        # The flush writes several logs, then waits for the index lock we hold.
        with storage._store.index_lock:
            done = storage.request_flush()
            # Written (several logs) and the entry logs released: now waiting for the index.
            wait_until(
                lambda: (
                    len(files(config.ledger_path, "entrylog-")) >= 3
                    and not storage._store.logs.lock.locked()
                )
            )
            logs = files(config.ledger_path, "entrylog-")
            report = storage.gc_once()  # sees logs without any location in the index
            assert report.deleted_logs == 0
            assert files(config.ledger_path, "entrylog-") == logs
        wait(done)
        for e in entries:
            assert storage.read(7, e.entry_id).entry == e
    finally:
        storage.close()


def test_reads_stay_right_while_gc_compaction_and_flushes_run(tmp_path: Path) -> None:
    # Everything in the background at once: flushes every few ms, GC and aggressive
    # compaction every 10 ms, while the test overwrites, trims, truncates and reads.
    config = make_config(
        tmp_path,
        entry_log_size_limit_bytes=96 << 10,
        flush_interval_ms=3,
        gc_interval_ms=10,
        compaction_interval_ms=10,
        minor_compaction_threshold=0.9,
    )
    storage, _ = open_storage(config)
    rng = random.Random(7)
    model: dict[int, bytes] = {}
    first = 0
    try:
        for round_ in range(40):
            ids = [rng.randrange(first, first + 60) for _ in range(10)]
            entries = [entry(7, i, os.urandom(rng.randrange(10, 3000))) for i in sorted(set(ids))]
            wait(storage.add_batch(add_request(7, 1, entries)).durable)
            model.update({e.entry_id: e.payload for e in entries})
            if round_ % 5 == 4:
                first += 7
                wait(storage.trim(7, first).durable)
                model = {k: v for k, v in model.items() if k >= first}
            if round_ % 7 == 6:
                after = first + rng.randrange(0, 60)
                wait(storage.truncate(7, 1, after).durable)
                model = {k: v for k, v in model.items() if k <= after}
            for entry_id, payload in model.items():
                got = storage.read(7, entry_id)
                assert got.code == pb.OK, (round_, entry_id, got)
                assert got.entry.payload == payload
    finally:
        storage.close()
    storage, _ = open_storage(config)
    try:
        for entry_id, payload in model.items():
            assert storage.read(7, entry_id).entry.payload == payload
    finally:
        storage.close()
