"""Real bookie processes over gRPC: acknowledged entries survive kill -9, the journal is replayed
after a crash and not after a clean shutdown, and the term rule, truncation and trimming hold
across restarts."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from stream.metadata import paths
from stream.sandbox.ports import free_port
from stream.wire import bookie_pb2 as pb
from tests.integration.bookie_support import (
    METADATA_UNCHECKED,
    AddPipeline,
    BookieFactory,
    add_all,
    add_request,
    make_entry,
    payload_of,
    wait_until,
)

pytestmark = pytest.mark.integration

STREAM = 7


@pytest.fixture
def bookies(tmp_path: Path, metadata_root: str) -> Iterator[BookieFactory]:
    factory = BookieFactory(tmp_path, metadata_root, unsafe_skips=METADATA_UNCHECKED)
    try:
        yield factory
    finally:
        factory.stop_all()


def read_all(stub: object, stream_id: int, last: int) -> dict[int, bytes]:
    """Returns entry id -> payload for [0, last] read with ReadRange, checking the final code."""
    request = pb.ReadRangeRequest(stream_id=stream_id, first_entry_id=0, last_entry_id=last)
    found: dict[int, bytes] = {}
    responses = list(stub.ReadRange(request, timeout=30))  # type: ignore[attr-defined]
    for response in responses:
        for entry in response.entries:
            found[entry.entry_id] = entry.payload
    assert responses[-1].code == pb.OK, responses[-1]
    return found


@pytest.mark.parametrize("journal_thread", [False, True], ids=["loop-commits", "journal-thread"])
def test_acknowledged_entries_survive_kill9_mid_stream(
    bookies: BookieFactory, journal_thread: bool
) -> None:
    # A slow group commit (with the journal's thread) keeps records in memory for a while: an
    # ack sent before the journal wrote and synced them would be lost by the kill.
    bookie = bookies.start(
        "bookie-1",
        journal_write_data=True,
        flush_interval_ms=60_000,
        journal_max_group_wait_ms=20,
        journal_thread=journal_thread,
    )
    pipeline = AddPipeline(bookie.stub(), window=32)
    batch = 100
    stop = threading.Event()

    def write() -> None:
        next_id = 0
        while not stop.is_set():
            ids = range(next_id, next_id + batch)
            request = add_request(STREAM, 1, ids, lac=next_id - 1, request_id=next_id, size=200)
            if not pipeline.send(request):
                return
            next_id += batch

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        # Crash once a good share is acknowledged, with many batches still in flight.
        wait_until(lambda: len(pipeline.acked()) >= 20_000, 60, "20k acknowledged entries")
        bookie.kill9()
    finally:
        stop.set()
        writer.join(30)
    pipeline.done.wait(10)
    acked = pipeline.acked()
    assert pipeline.error is not None, "the stream must break when the bookie dies"
    assert len(acked) >= 20_000
    # Acknowledged in order: ids 0..n-1 without a gap.
    assert acked == list(range(len(acked)))

    bookie.start()
    info = bookie.wait_ready()
    assert info.unclean_start
    stub = bookie.stub()
    found = read_all(stub, STREAM, len(acked) - 1)
    assert sorted(found) == acked
    for entry_id in acked:
        assert found[entry_id] == payload_of(STREAM, entry_id, 200), entry_id
    # Point reads agree with the range read, checksums included.
    for entry_id in (0, len(acked) // 2, len(acked) - 1):
        r = stub.Read(pb.ReadRequest(stream_id=STREAM, entry_id=entry_id), timeout=10)
        assert r.code == pb.OK
        assert r.entry == make_entry(STREAM, entry_id, payload_of(STREAM, entry_id, 200))


def metric(bookie_metrics: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{bookie_metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"metric {name} not exported")


def test_crash_replays_journal_and_clean_restart_replays_nothing(bookies: BookieFactory) -> None:
    # Entries stay in the journal and write cache only: no flush in this test's lifetime.
    bookie = bookies.create("bookie-1", flush_interval_ms=600_000)
    bookie.metrics_port = free_port()
    bookie.start()
    first = bookie.wait_ready()
    assert not first.unclean_start
    requests = [add_request(STREAM, 1, range(i, i + 50), request_id=i) for i in range(0, 500, 50)]
    responses = add_all(bookie.stub(), requests)
    assert all(set(r.codes) == {pb.OK} for r in responses)

    bookie.kill9()
    bookie.start()
    after_crash = bookie.wait_ready()
    assert after_crash.unclean_start
    assert after_crash.replayed_records > 0
    assert after_crash.replayed_entries == 500
    assert "bookie.storage_opened" in bookie.log_path.read_text()
    assert metric(bookie.metrics_address, "streamkeeper_bookie_start_replayed_records") > 0
    assert metric(bookie.metrics_address, "streamkeeper_bookie_start_unclean") == 1
    assert len(read_all(bookie.stub(), STREAM, 499)) == 500

    assert bookie.terminate() == 0
    bookie.start()
    after_clean = bookie.wait_ready()
    assert not after_clean.unclean_start
    assert after_clean.replayed_records == 0
    assert after_clean.replayed_entries == 0
    assert metric(bookie.metrics_address, "streamkeeper_bookie_start_unclean") == 0
    assert len(read_all(bookie.stub(), STREAM, 499)) == 500


def test_sigterm_is_a_clean_shutdown(bookies: BookieFactory, metadata_root: str) -> None:
    bookie = bookies.start("bookie-1", shutdown_grace_ms=1000)
    add_all(bookie.stub(), [add_request(STREAM, 1, range(10), lac=8)])
    # A writer keeps streaming through the shutdown.
    pipeline = AddPipeline(bookie.stub(), window=8)
    stop = threading.Event()

    def write() -> None:
        next_id = 10
        while not stop.is_set() and pipeline.send(
            add_request(STREAM, 1, range(next_id, next_id + 50), request_id=next_id), 30
        ):
            next_id += 50

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    zk = KazooClient(hosts=metadata_root)
    zk.start(timeout=10)
    try:
        node = paths.BOOKIES_AVAILABLE + "/bookie-1"
        wait_until(lambda: zk.exists(node), 20, "registration")
        data, _ = zk.get(node)
        assert bookie.address.encode() in data
        wait_until(lambda: len(pipeline.acked()) >= 2000, 30, "writes under way")
        assert bookie.terminate(timeout_s=20) == 0
        # Unregistered at once (not after a session timeout).
        assert zk.exists(node) is None
    finally:
        stop.set()
        writer.join(30)
        zk.stop()
        zk.close()
    pipeline.done.wait(10)
    acked = [*range(10), *pipeline.acked()]
    log_text = bookie.log_path.read_text()
    assert "bookie.stopped" in log_text
    bookie.start()
    info = bookie.wait_ready()
    assert not info.unclean_start and info.replayed_records == 0
    found = read_all(bookie.stub(), STREAM, max(acked))
    assert set(acked) <= set(found)
    state = bookie.stub().StreamState(pb.StreamStateRequest(stream_id=STREAM), timeout=10)
    assert (state.code, state.term, state.lac) == (pb.OK, 1, 8)
    assert state.last_entry_id >= max(acked)


def test_term_rule_truncation_and_trim_survive_kill9(bookies: BookieFactory) -> None:
    bookie = bookies.start("bookie-1")
    stub = bookie.stub()
    # Entries 0..9 and 15..19 (a bookie of a striped ensemble holds gaps), term 5.
    [r1, r2] = add_all(
        stub, [add_request(STREAM, 5, range(10)), add_request(STREAM, 5, range(15, 20))]
    )
    assert set(r1.codes) == set(r2.codes) == {pb.OK}
    assert r1.bookie_term == 5

    # A lower term is refused, whatever the request.
    [low] = add_all(stub, [add_request(STREAM, 3, range(20, 22))])
    assert list(low.codes) == [pb.INVALID_TERM] * 2 and low.bookie_term == 5
    fence = stub.Fence(pb.FenceRequest(stream_id=STREAM, term=4), timeout=10)
    assert (fence.code, fence.bookie_term) == (pb.INVALID_TERM, 5)
    truncate = stub.Truncate(
        pb.TruncateRequest(stream_id=STREAM, term=4, after_entry_id=0), timeout=10
    )
    assert (truncate.code, truncate.bookie_term) == (pb.INVALID_TERM, 5)
    recovery_read = stub.Read(pb.ReadRequest(stream_id=STREAM, entry_id=0, term=4), timeout=10)
    assert (recovery_read.code, recovery_read.bookie_term) == (pb.INVALID_TERM, 5)

    # A higher term is recorded (fence), even for a stream the bookie never saw.
    fence = stub.Fence(pb.FenceRequest(stream_id=STREAM, term=7), timeout=10)
    assert (fence.code, fence.bookie_term, fence.last_entry_id) == (pb.OK, 7, 19)
    fresh = stub.Fence(pb.FenceRequest(stream_id=STREAM + 1, term=3), timeout=10)
    assert (fresh.code, fresh.bookie_term, fresh.last_entry_id) == (pb.OK, 3, -1)

    # The recovery's truncate no-op at 12 removes every higher entry (15..19).
    noop = pb.AddRequest(
        stream_id=STREAM,
        term=7,
        lac=9,
        lafr=-1,
        recovery=True,
        entries=[make_entry(STREAM, 12, b"", flags=pb.NOOP | pb.TRUNCATE)],
    )
    [r] = add_all(stub, [noop])
    assert list(r.codes) == [pb.OK]
    for entry_id in (15, 19):
        read = stub.Read(pb.ReadRequest(stream_id=STREAM, entry_id=entry_id), timeout=10)
        assert read.code == pb.NO_SUCH_ENTRY, entry_id

    # Truncate (new-member truncation) drops everything above 7; Trim everything below 3.
    truncate = stub.Truncate(
        pb.TruncateRequest(stream_id=STREAM, term=7, after_entry_id=7), timeout=10
    )
    assert truncate.code == pb.OK
    trim = stub.Trim(pb.TrimRequest(stream_id=STREAM, before_entry_id=3), timeout=10)
    assert (trim.code, trim.first_entry_id) == (pb.OK, 3)

    def check(stub: object) -> None:
        def read(entry_id: int) -> pb.ReadResponse:
            request = pb.ReadRequest(stream_id=STREAM, entry_id=entry_id)
            return stub.Read(request, timeout=10)  # type: ignore[attr-defined]

        for entry_id in (0, 2):
            r = read(entry_id)
            assert (r.code, r.first_entry_id) == (pb.TRIMMED, 3), entry_id
        for entry_id in (3, 7):
            r = read(entry_id)
            assert r.code == pb.OK and r.entry.payload == payload_of(STREAM, entry_id)
        for entry_id in (8, 12, 19):
            assert read(entry_id).code == pb.NO_SUCH_ENTRY, entry_id
        state = stub.StreamState(  # type: ignore[attr-defined]
            pb.StreamStateRequest(stream_id=STREAM), timeout=10
        )
        assert (state.code, state.term, state.first_entry_id, state.last_entry_id) == (
            pb.OK,
            7,
            3,
            7,
        )
        other = stub.StreamState(  # type: ignore[attr-defined]
            pb.StreamStateRequest(stream_id=STREAM + 1), timeout=10
        )
        assert (other.code, other.term) == (pb.OK, 3)

    check(stub)
    bookie.kill9()
    bookie.start()
    assert bookie.wait_ready().unclean_start
    check(bookie.stub())
    # The recorded term still fences the old writer after the crash.
    [late] = add_all(bookie.stub(), [add_request(STREAM, 5, range(8, 9))])
    assert list(late.codes) == [pb.INVALID_TERM] and late.bookie_term == 7
