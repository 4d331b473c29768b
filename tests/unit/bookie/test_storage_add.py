"""StreamStorage adds and reads: round trips from the write cache and from entry logs, the
per-entry checks, LAC/LAFR, the LAC hook, range reads and back-pressure."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from stream.bookie.storage import StreamStorage
from stream.bookie.storage.adds import _entry_is_valid, _scan_entries
from stream.framing.prepare import prepare_entry
from stream.protocol.checksum import entry_checksum
from stream.wire import bookie_pb2 as pb

from .storage_support import (
    add_request,
    crash_and_reopen,
    entry,
    flush,
    make_config,
    open_storage,
    wait,
    wait_until,
)


@pytest.fixture
def storage(tmp_path: Path):
    s, _ = open_storage(make_config(tmp_path))
    yield s
    s.close()


def test_add_then_read_from_cache_and_after_flush(storage: StreamStorage) -> None:
    entries = [entry(7, i) for i in range(10)]
    outcome = storage.add_batch(add_request(7, 1, entries, lac=4, lafr=2))
    assert outcome.codes == [pb.OK] * 10
    assert outcome.entry_ids == list(range(10))
    assert outcome.bookie_term == 1
    wait(outcome.durable)
    read = storage.read(7, 3)
    assert read.code == pb.OK and read.entry == entries[3]
    assert (read.lac, read.bookie_term) == (4, 1)
    flush(storage)
    assert storage.stats()["write_cache_bytes"] == 0
    assert storage.stats()["index_entries"] == 10
    for i in range(10):
        got = storage.read(7, i)
        assert got.code == pb.OK
        assert got.entry == entries[i]
        assert got.entry.payload == entries[i].payload
    assert storage.lac(7) == (4, 2)
    assert storage.stream_state(7).last_entry_id == 9


def test_read_unknown_stream_and_missing_entry(storage: StreamStorage) -> None:
    assert storage.read(9, 0).code == pb.NO_SUCH_STREAM
    assert storage.lac(9) is None
    assert storage.stream_state(9) is None
    wait(storage.add_batch(add_request(9, 1, [entry(9, 0)])).durable)
    assert storage.read(9, 1).code == pb.NO_SUCH_ENTRY
    assert storage.read(9, -1).code == pb.BAD_REQUEST


def test_overwrite_keeps_latest_version(storage: StreamStorage) -> None:
    wait(storage.add_batch(add_request(7, 1, [entry(7, 0, b"old")])).durable)
    flush(storage)
    wait(storage.add_batch(add_request(7, 1, [entry(7, 0, b"new")])).durable)
    assert storage.read(7, 0).entry.payload == b"new"
    flush(storage)
    assert storage.read(7, 0).entry.payload == b"new"


def test_bad_entries_are_refused_and_the_rest_stored(storage: StreamStorage) -> None:
    good = entry(7, 0)
    bad_crc = entry(7, 1)
    bad_crc.crc32c ^= 1
    negative = entry(7, -5)
    oversized = entry(7, 3, b"x" * ((64 << 10) + 1))
    also_good = entry(7, 4)
    outcome = storage.add_batch(add_request(7, 1, [good, bad_crc, negative, oversized, also_good]))
    assert outcome.codes == [pb.OK, pb.BAD_REQUEST, pb.BAD_REQUEST, pb.BAD_REQUEST, pb.OK]
    assert "refused" in outcome.message
    wait(outcome.durable)
    assert storage.read(7, 0).code == pb.OK
    assert storage.read(7, 1).code == pb.NO_SUCH_ENTRY
    assert storage.read(7, 3).code == pb.NO_SUCH_ENTRY
    assert storage.read(7, 4).code == pb.OK


def test_checksum_covers_header_fields(storage: StreamStorage) -> None:
    # An entry checksummed for another stream, id, flag or timestamp is refused.
    wrong_stream = entry(8, 0)
    wrong_id = entry(7, 5)
    wrong_id.entry_id = 6
    wrong_time = entry(7, 7)
    wrong_time.timestamp_ms += 1
    outcome = storage.add_batch(add_request(7, 1, [wrong_stream, wrong_id, wrong_time]))
    assert outcome.codes == [pb.BAD_REQUEST] * 3
    assert storage.stream_state(7).last_entry_id == -1


def test_inlined_checksum_matches_protocol_rule() -> None:
    # The hot loop inlines stream.protocol.checksum.entry_checksum: both must agree.
    payloads = [b"", b"a", os.urandom(1000), os.urandom(70_000)]
    entries = []
    for i, payload in enumerate(payloads):
        e = pb.Entry(entry_id=i * 1000, flags=i % 4, timestamp_ms=i * 17, payload=payload)
        e.crc32c = entry_checksum(42, e.entry_id, e.flags, e.timestamp_ms, payload)
        entries.append(e)
    ids, total, special = _scan_entries(42, entries, 1 << 20)
    assert ids == [0, 1000, 2000, 3000]
    assert total == sum(map(len, payloads))
    assert special == [2, 3]  # the TRUNCATE-flagged ones, looked at closely
    assert all(_entry_is_valid(42, e, 1 << 20) for e in entries)
    entries[0].crc32c ^= 0x80000000
    assert _scan_entries(42, entries, 1 << 20)[2] == [0, 2, 3]
    assert not _entry_is_valid(42, entries[0], 1 << 20)


def test_stream_zero_and_term_zero_are_bad_requests(storage: StreamStorage) -> None:
    outcome = storage.add_batch(add_request(0, 1, [entry(0, 0), entry(0, 1)]))
    assert outcome.codes == [pb.BAD_REQUEST] * 2
    assert outcome.durable is None
    outcome = storage.add_batch(add_request(7, 0, [entry(7, 0)]))
    assert outcome.codes == [pb.BAD_REQUEST]
    assert storage.stream_state(7) is None
    assert storage.stream_ids() == []


def test_empty_batch_carries_lac_and_lafr(storage: StreamStorage) -> None:
    wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(5)])).durable)
    seen: list[tuple[int, int]] = []
    storage.on_lac_advanced = lambda stream_id, lac: seen.append((stream_id, lac))
    outcome = storage.add_batch(add_request(7, 1, [], lac=4, lafr=3))
    assert outcome.codes == [pb.OK]
    assert outcome.durable is None  # nothing to make durable
    assert storage.lac(7) == (4, 3)
    assert seen == [(7, 4)]
    # LAC never goes backwards, and an unchanged LAC wakes nobody.
    storage.add_batch(add_request(7, 1, [], lac=2, lafr=1))
    assert storage.lac(7) == (4, 3)
    assert seen == [(7, 4)]


def test_lac_hook_failure_does_not_fail_the_add(storage: StreamStorage) -> None:
    def broken(stream_id: int, lac: int) -> None:
        raise RuntimeError("boom")

    storage.on_lac_advanced = broken
    outcome = storage.add_batch(add_request(7, 1, [entry(7, 0)], lac=0))
    assert outcome.codes == [pb.OK]
    wait(outcome.durable)


def test_raw_bytes_are_journaled_as_given(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    storage, _ = open_storage(config)
    request = add_request(7, 1, [entry(7, i) for i in range(3)])
    wait(storage.add_batch(request, request.SerializeToString()).durable)
    storage.abandon()
    storage, report = open_storage(config)
    assert report.entries_replayed == 3
    assert storage.read(7, 2).entry == request.entries[2]
    storage.close()


def test_read_range_across_cache_snapshot_and_logs(storage: StreamStorage) -> None:
    entries = [entry(7, i, os.urandom(100)) for i in range(50)]
    wait(storage.add_batch(add_request(7, 1, entries[:20])).durable)
    flush(storage)
    wait(storage.add_batch(add_request(7, 1, entries[20:40])).durable)
    flush(storage)
    wait(storage.add_batch(add_request(7, 1, entries[40:])).durable)
    # Overwrite one flushed entry in the cache: the cache wins.
    newer = entry(7, 10, b"newer")
    wait(storage.add_batch(add_request(7, 1, [newer])).durable)
    expected = entries[:10] + [newer] + entries[11:]
    batches = list(storage.read_range(7, 0, 49, 1000))
    assert all(code == pb.OK for code, _ in batches)
    assert len(batches) > 3  # batched by bytes
    assert [e for _, batch in batches for e in batch] == expected
    # A range past the end stops at the first missing entry.
    batches = list(storage.read_range(7, 45, 60, 1 << 20))
    assert batches[-1][0] == pb.NO_SUCH_ENTRY
    assert [e.entry_id for _, b in batches for e in b] == list(range(45, 50))
    assert list(storage.read_range(8, 0, 1, 0)) == [(pb.NO_SUCH_STREAM, [])]
    assert list(storage.read_range(7, 5, 4, 0)) == [(pb.BAD_REQUEST, [])]


def test_read_range_reads_adjacent_entries_from_logs(storage: StreamStorage) -> None:
    entries = [entry(7, i, os.urandom(3000)) for i in range(300)]
    for start in range(0, 300, 100):
        wait(storage.add_batch(add_request(7, 1, entries[start : start + 100])).durable)
    flush(storage)
    got = [e for _, batch in storage.read_range(7, 0, 299, 64 << 10) for e in batch]
    assert got == entries


def test_too_busy_when_both_caches_are_full(tmp_path: Path) -> None:
    storage, _ = open_storage(make_config(tmp_path, write_cache_max_bytes=64 << 10))
    try:
        codes: list[int] = []
        # Hold the entry logs: the flusher takes a snapshot and then cannot write it.
        with storage._store.logs.lock:
            for batch in range(40):
                entries = [entry(7, batch * 10 + i, b"x" * 1000) for i in range(10)]
                outcome = storage.add_batch(add_request(7, 1, entries))
                codes.append(outcome.codes[0])
                if outcome.codes[0] == pb.TOO_BUSY:
                    assert outcome.codes == [pb.TOO_BUSY] * 10
                    break
                wait(outcome.durable)
        assert pb.TOO_BUSY in codes
        assert storage.stats()["too_busy_batches"] >= 1
        # Once the flusher catches up, adds are taken again.
        wait_until(lambda: storage.stats()["write_cache_bytes"] < 32 << 10)
        outcome = storage.add_batch(add_request(7, 1, [entry(7, 1000)]))
        assert outcome.codes == [pb.OK]
    finally:
        storage.close()


def test_requests_after_close_answer_internal(tmp_path: Path) -> None:
    storage, _ = open_storage(make_config(tmp_path))
    storage.close()
    assert storage.add_batch(add_request(7, 1, [entry(7, 0)])).codes == [pb.INTERNAL]
    assert storage.read(7, 0).code == pb.INTERNAL
    assert storage.fence(7, 1).code == pb.INTERNAL


def test_many_streams_interleaved_survive_flush_and_crash(tmp_path: Path) -> None:
    config = make_config(tmp_path, entry_log_size_limit_bytes=96 << 10)
    storage, _ = open_storage(config)
    written: dict[tuple[int, int], pb.Entry] = {}
    for round_ in range(6):
        for stream_id in (3, 1 << 40, 17):
            entries = [entry(stream_id, round_ * 10 + i, os.urandom(700)) for i in range(10)]
            wait(storage.add_batch(add_request(stream_id, 1, entries)).durable)
            written.update({(stream_id, e.entry_id): e for e in entries})
        if round_ % 2:
            flush(storage)
    assert storage.stats()["entry_logs"] >= 2  # rotated on the way
    assert sorted(storage.stream_ids()) == [3, 17, 1 << 40]
    storage.abandon()
    storage, _ = open_storage(config)
    try:
        for (stream_id, entry_id), e in written.items():
            assert storage.read(stream_id, entry_id).entry == e
        for stream_id in (3, 17, 1 << 40):
            got = [e for _, b in storage.read_range(stream_id, 0, 59, 10_000) for e in b]
            assert got == [written[(stream_id, i)] for i in range(60)]
    finally:
        storage.close()


def _attributed(stream_id: int, entry_id: int, **attributes: object) -> pb.Entry:
    return prepare_entry(stream_id, entry_id, 0, 1_700_000_000_000, b"p", **attributes).entry()


def test_entries_with_attributes_round_trip_through_cache_logs_and_journal(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path)
    storage, _ = open_storage(config)
    entries = [
        _attributed(7, 0, key=b"k0"),
        entry(7, 1),
        _attributed(7, 2, key=b"", headers=(("h", b"1"), ("h", b"2"))),
        _attributed(7, 3, sequence=12),
    ]
    outcome = storage.add_batch(add_request(7, 1, entries))
    assert outcome.codes == [pb.OK] * 4
    wait(outcome.durable)
    assert [storage.read(7, i).entry for i in range(4)] == entries  # from the write cache
    flush(storage)
    assert [storage.read(7, i).entry for i in range(4)] == entries  # from the entry logs
    assert [e for _, batch in storage.read_range(7, 0, 3) for e in batch] == entries
    wait(storage.add_batch(add_request(7, 1, [_attributed(7, 4, key=b"j")])).durable)
    storage, report = crash_and_reopen(storage, config)  # entry 4 replayed from the journal
    try:
        assert report.entries_replayed >= 1
        got = [storage.read(7, i).entry for i in range(5)]
        assert got == [*entries, _attributed(7, 4, key=b"j")]
        assert got[2].HasField("key") and not got[1].HasField("key")
    finally:
        storage.close()


def test_attributes_are_checked_against_the_checksum(storage: StreamStorage) -> None:
    # A key, a header or a sequence changed after the checksum was computed is refused; so is
    # an entry whose ATTRIBUTES flag was cleared (its checksum covered them).
    changed_key = _attributed(7, 0, key=b"k")
    changed_key.key = b"K"
    added_header = _attributed(7, 0, key=b"k")
    added_header.headers.add(name="h", value=b"v")
    changed_sequence = _attributed(7, 0, sequence=3)
    changed_sequence.sequence = 4
    dropped_flag = _attributed(7, 0, key=b"k")
    dropped_flag.flags = 0
    outcome = storage.add_batch(
        add_request(7, 1, [changed_key, added_header, changed_sequence, dropped_flag])
    )
    assert outcome.codes == [pb.BAD_REQUEST] * 4
    assert storage.stream_state(7).last_entry_id == -1


def test_write_cache_holds_nothing_the_cyclic_gc_walks(storage: StreamStorage) -> None:
    """The write cache keeps entries as bytes, not protobuf objects: a second of adds kept as
    `Entry` objects made every full collection walk them all (30-85 ms stalls of the event
    loop). Adds and repair copies both land in the cache that way, and read back whole."""
    entries = [entry(7, i) for i in range(5)]
    wait(storage.add_batch(add_request(7, 1, entries)).durable)
    assert storage.store_copies(7, [entry(7, 5)]) == 1
    cached = storage._store.active.streams[7]
    assert sorted(cached) == list(range(6))
    assert not any(map(gc.is_tracked, cached.values()))
    assert not gc.is_tracked(cached)
    assert [storage.read(7, i).entry for i in range(6)] == [*entries, entry(7, 5)]
