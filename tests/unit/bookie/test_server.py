"""The gRPC service in-process over the real storage engine (in tmp_path): ordering of pipelined
adds, waiting for durability (the journal's commit held back), long polls, malformed requests,
internal errors (a storage method made to raise), read-only mode and limbo answers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from stream.bookie.config import BookieConfig
from stream.bookie.disk import DiskStatus
from stream.bookie.server import BookieService, StartReport, add_to_server, server_options
from stream.bookie.storage import StreamStorage
from stream.bookie.storage.journal import Journal
from stream.bookie.terms import MetadataTerms
from stream.sandbox.ports import free_port
from stream.wire import bookie_pb2 as pb
from stream.wire import bookie_pb2_grpc

from .storage_support import entry as checked_entry


class JournalGate:
    """Holds the real journal thread's group commits (its `_commit_group`) until opened:
    nothing the storage promises becomes durable meanwhile."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        self.open.set()
        original = Journal._commit_group
        gate = self.open

        def held_commit(journal: Journal, items: list[tuple[int, object]], fut: Any) -> None:
            if not gate.wait(30):
                raise TimeoutError("journal gate never opened")
            original(journal, items, fut)

        monkeypatch.setattr(Journal, "_commit_group", held_commit)


class FailOnce:
    """Makes a real storage method raise on its next call (then behave again)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.armed = False
        original = getattr(StreamStorage, name)
        failer = self

        def maybe_fail(storage: StreamStorage, *args: Any, **kwargs: Any) -> Any:
            if failer.armed:
                failer.armed = False
                raise RuntimeError("boom")
            return original(storage, *args, **kwargs)

        monkeypatch.setattr(StreamStorage, name, maybe_fail)


def entry(entry_id: int, payload: bytes = b"x", stream_id: int = 1) -> pb.Entry:
    return checked_entry(stream_id, entry_id, payload)


def add(stream_id: int, term: int, ids: range, lac: int = -1, rid: int = 0) -> pb.AddRequest:
    return pb.AddRequest(
        stream_id=stream_id,
        term=term,
        lac=lac,
        lafr=-1,
        request_id=rid,
        entries=[entry(i, f"e{i}".encode(), stream_id) for i in ids],
    )


@dataclass
class Harness:
    storage: StreamStorage
    service: BookieService
    stub: bookie_pb2_grpc.BookieStub
    channel: grpc.aio.Channel


async def add_codes(h: Harness, request: pb.AddRequest) -> tuple[list[int], int]:
    """Sends one add batch on its own Add stream; returns its codes and the bookie's term."""

    async def one() -> AsyncIterator[pb.AddRequest]:
        yield request

    responses = [r async for r in h.stub.Add(one())]
    return list(responses[0].codes), responses[0].bookie_term


async def start(
    data_dir: Path,
    *,
    metadata_terms: Callable[[StreamStorage], MetadataTerms] | None = None,
    **overrides: Any,
) -> tuple[Harness, grpc.aio.Server]:
    port = free_port()
    config = BookieConfig.from_dict(
        {
            "bookie_id": "b1",
            "listen": f"127.0.0.1:{port}",
            "metadata": "127.0.0.1:1/x",
            "metrics_listen": "",
            "data_dir": str(data_dir),
            # No timer-driven flush, GC or compaction during a test.
            "flush_interval_ms": 3_600_000,
            "gc_interval_ms": 3_600_000,
            "compaction_interval_ms": 3_600_000,
            "major_compaction_interval_ms": 3_600_000,
            "journal_max_group_wait_ms": 0.0,
            **overrides,
        }
    )
    storage = StreamStorage(config)
    storage.open()  # on the event loop's thread, which owns the storage from here on
    service = BookieService(
        config,
        storage,
        instance_id="inst",
        start_report=StartReport(unclean_start=True, replayed_records=7, replayed_entries=5),
        disk_status=DiskStatus(False, 10, 100, "/d", 0.1),
        metadata_terms=metadata_terms(storage) if metadata_terms is not None else None,
    )
    server = grpc.aio.server(options=server_options(config))
    add_to_server(service, server)
    server.add_insecure_port(config.listen)
    await server.start()
    channel = grpc.aio.insecure_channel(config.listen)
    return Harness(storage, service, bookie_pb2_grpc.BookieStub(channel), channel), server


def run(data_dir: Path, coro_fn: Callable[[Harness], Awaitable[None]], **overrides: Any) -> None:
    """Runs `coro_fn` against a started service; `overrides` are config keys, and
    `metadata_terms`, a factory of the service's checks against metadata."""

    async def main() -> None:
        h, server = await start(data_dir, **overrides)
        try:
            await asyncio.wait_for(coro_fn(h), 20)
        finally:
            await h.channel.close()
            await server.stop(0)
            h.storage.close()

    asyncio.run(main())


def test_pipelined_adds_answer_in_order_after_durability(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = JournalGate(monkeypatch)

    async def body(h: Harness) -> None:
        gate.open.clear()  # hold the journal: nothing is durable yet
        sent = asyncio.Queue[pb.AddRequest | None]()

        async def requests() -> AsyncIterator[pb.AddRequest]:
            while (r := await sent.get()) is not None:
                yield r

        call = h.stub.Add(requests())
        for i in range(20):
            await sent.put(add(1, 1, range(i * 10, i * 10 + 10), rid=i))
        # All 20 batches reach storage before any is durable (pipelining)...
        deadline = time.monotonic() + 10
        while (state := h.storage.stream_state(1)) is None or state.last_entry_id < 199:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        # ...and none is answered until the journal syncs.
        read = asyncio.ensure_future(call.read())
        done, _ = await asyncio.wait({read}, timeout=0.2)
        assert not done
        gate.open.set()
        responses = [await read] + [await call.read() for _ in range(19)]
        await sent.put(None)
        assert [r.request_id for r in responses] == list(range(20))
        for i, r in enumerate(responses):
            assert list(r.entry_ids) == list(range(i * 10, i * 10 + 10))
            assert list(r.codes) == [pb.OK] * 10
            assert r.bookie_term == 1
        assert await call.read() == grpc.aio.EOF

    run(tmp_path, body)


def test_malformed_adds_are_refused_and_the_stream_goes_on(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        requests = [
            add(0, 1, range(2)),  # stream 0
            add(1, 0, range(2)),  # term 0
            pb.AddRequest(stream_id=1, term=1, lac=-5, lafr=-1),  # lac below -1
            add(1, 2, range(3)),  # fine
            add(1, 1, range(3, 4)),  # lower term
        ]
        responses = [r async for r in h.stub.Add(iter(requests))]
        assert [list(r.codes) for r in responses] == [
            [pb.BAD_REQUEST] * 2,
            [pb.BAD_REQUEST] * 2,
            [pb.BAD_REQUEST],
            [pb.OK] * 3,
            [pb.INVALID_TERM],
        ]
        assert "stream_id 0" in responses[0].message
        assert responses[4].bookie_term == 2

    run(tmp_path, body)


def test_internal_error_answers_internal_and_keeps_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_fails = FailOnce(monkeypatch, "add_batch")
    read_fails = FailOnce(monkeypatch, "read")

    async def body(h: Harness) -> None:
        add_fails.armed = True
        responses = [
            r async for r in h.stub.Add(iter([add(1, 1, range(2)), add(1, 1, range(2, 4))]))
        ]
        assert list(responses[0].codes) == [pb.INTERNAL] * 2
        assert "boom" in responses[0].message
        assert list(responses[1].codes) == [pb.OK] * 2
        read_fails.armed = True
        r = await h.stub.Read(pb.ReadRequest(stream_id=1, entry_id=0))
        assert r.code == pb.INTERNAL
        r = await h.stub.Read(pb.ReadRequest(stream_id=1, entry_id=2))
        assert r.code == pb.OK and r.entry.payload == b"e2"

    run(tmp_path, body)


def test_read_lac_long_poll_wakes_on_lac_advance(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        [r async for r in h.stub.Add(iter([add(1, 1, range(5), lac=3)]))]
        poll = asyncio.ensure_future(
            h.stub.ReadLac(pb.ReadLacRequest(stream_id=1, known_lac=3, timeout_ms=30_000))
        )
        done, _ = await asyncio.wait({poll}, timeout=0.2)
        assert not done, "the poll must wait while the LAC stays at known_lac"
        started = time.monotonic()
        [r async for r in h.stub.Add(iter([pb.AddRequest(stream_id=1, term=1, lac=4, lafr=2)]))]
        response = await poll
        assert (response.code, response.lac, response.lafr) == (pb.OK, 4, 2)
        assert time.monotonic() - started < 10
        assert not h.service.core._lac_polls.waiters

    run(tmp_path, body)


def test_read_lac_times_out_capped_and_unknown_stream(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        r = await h.stub.ReadLac(pb.ReadLacRequest(stream_id=9, known_lac=-1, timeout_ms=0))
        assert r.code == pb.NO_SUCH_STREAM
        [r async for r in h.stub.Add(iter([add(1, 1, range(1), lac=0)]))]
        started = time.monotonic()
        r = await h.stub.ReadLac(pb.ReadLacRequest(stream_id=1, known_lac=0, timeout_ms=60_000))
        assert (r.code, r.lac) == (pb.OK, 0)
        assert time.monotonic() - started < 10  # capped by read_lac_max_wait_ms
        r = await h.stub.ReadLac(pb.ReadLacRequest(stream_id=1, known_lac=-1, timeout_ms=60_000))
        assert (r.code, r.lac) == (pb.OK, 0)
        assert not h.service.core._lac_polls.waiters

    run(tmp_path, body, read_lac_max_wait_ms=300)


def test_unary_requests_validate_and_answer(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        s = h.stub
        assert (await s.Fence(pb.FenceRequest(stream_id=1, term=0))).code == pb.BAD_REQUEST
        assert (await s.Fence(pb.FenceRequest(stream_id=0, term=1))).code == pb.BAD_REQUEST
        f = await s.Fence(pb.FenceRequest(stream_id=1, term=4))
        assert (f.code, f.bookie_term) == (pb.OK, 4)
        assert (await s.Read(pb.ReadRequest(stream_id=1, entry_id=-1))).code == pb.BAD_REQUEST
        bad = pb.TruncateRequest(stream_id=1, term=4, after_entry_id=-2)
        assert (await s.Truncate(bad)).code == pb.BAD_REQUEST
        assert (await s.Trim(pb.TrimRequest(stream_id=1, before_entry_id=-1))).code == (
            pb.BAD_REQUEST
        )
        assert (await s.StreamState(pb.StreamStateRequest(stream_id=0))).code == pb.BAD_REQUEST
        assert (await s.StreamState(pb.StreamStateRequest(stream_id=2))).code == pb.NO_SUCH_STREAM
        st = await s.StreamState(pb.StreamStateRequest(stream_id=1))
        assert (st.code, st.term) == (pb.OK, 4)
        info = await s.Info(pb.InfoRequest())
        assert (info.bookie_id, info.instance_id, info.stream_count) == ("b1", "inst", 1)
        assert (info.unclean_start, info.replayed_records, info.replayed_entries) == (True, 7, 5)
        rr = pb.ReadRangeRequest(stream_id=1, first_entry_id=5, last_entry_id=4)
        assert [r.code async for r in s.ReadRange(rr)] == [pb.BAD_REQUEST]

    run(tmp_path, body)


def test_read_range_streams_batches(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        [r async for r in h.stub.Add(iter([add(1, 1, range(10), lac=9)]))]
        rr = pb.ReadRangeRequest(stream_id=1, first_entry_id=0, last_entry_id=20, max_batch_bytes=6)
        responses = [r async for r in h.stub.ReadRange(rr)]
        ids = [e.entry_id for r in responses for e in r.entries]
        assert ids == list(range(10))
        assert len(responses) > 1
        assert responses[-1].code == pb.NO_SUCH_ENTRY
        assert all(r.lac == 9 for r in responses)

    run(tmp_path, body)


def test_read_only_refuses_adds_and_truncates_but_not_recovery(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        h.service.set_disk_status(DiskStatus(True, 1, 100, "/d", 0.99))
        normal = add(1, 1, range(2))
        recovery = add(1, 1, range(2, 3))
        recovery.recovery = True
        responses = [r async for r in h.stub.Add(iter([normal, recovery]))]
        assert list(responses[0].codes) == [pb.READ_ONLY] * 2
        assert list(responses[1].codes) == [pb.OK]
        t = await h.stub.Truncate(pb.TruncateRequest(stream_id=1, term=1, after_entry_id=0))
        assert t.code == pb.READ_ONLY
        assert (await h.stub.Info(pb.InfoRequest())).read_only
        h.service.set_disk_status(DiskStatus(False, 50, 100, "/d", 0.5))
        responses = [r async for r in h.stub.Add(iter([add(1, 1, range(3, 4))]))]
        assert list(responses[0].codes) == [pb.OK]

    run(tmp_path, body)


@pytest.mark.parametrize(
    ("method", "response_type"),
    [
        ("Fence", pb.FenceResponse),
        ("Read", pb.ReadResponse),
        ("ReadLac", pb.ReadLacResponse),
        ("Truncate", pb.TruncateResponse),
        ("Trim", pb.TrimResponse),
        ("StreamState", pb.StreamStateResponse),
    ],
)
def test_garbage_bytes_answer_bad_request(tmp_path: Path, method: str, response_type: Any) -> None:
    async def body(h: Harness) -> None:
        call = h.channel.unary_unary(f"/streamkeeper.v1.Bookie/{method}")
        response = response_type.FromString(await call(b"\xff\xff\xff\xff\x0f garbage"))
        assert response.code == pb.BAD_REQUEST
        assert "malformed" in response.message

    run(tmp_path, body)


def test_garbage_bytes_on_streams_and_info(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        info = h.channel.unary_unary("/streamkeeper.v1.Bookie/Info")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await info(b"\xff\xff")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        read_range = h.channel.unary_stream("/streamkeeper.v1.Bookie/ReadRange")
        [data] = [d async for d in read_range(b"\xff\xff")]
        assert pb.ReadRangeResponse.FromString(data).code == pb.BAD_REQUEST
        add_call = h.channel.stream_stream("/streamkeeper.v1.Bookie/Add")
        good = add(1, 1, range(2)).SerializeToString()
        answers = [pb.AddResponse.FromString(d) async for d in add_call(iter([b"\xff\xff", good]))]
        assert [list(a.codes) for a in answers] == [[pb.BAD_REQUEST], [pb.OK, pb.OK]]
        assert (await h.stub.Info(pb.InfoRequest())).bookie_id == "b1"

    run(tmp_path, body)


def test_limbo_answers_unknown_instead_of_every_explicit_negative(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        s = h.stub
        [r async for r in s.Add(iter([add(1, 1, range(3), lac=2)]))]
        # As phase one leaves them: stream 5 is known only from the metadata.
        await asyncio.wrap_future(h.storage.set_limbo(1, True, term=2))
        await asyncio.wrap_future(h.storage.set_limbo(5, True, term=3))
        for sid, eid in ((1, 7), (5, 0)):
            assert (await s.Read(pb.ReadRequest(stream_id=sid, entry_id=eid))).code == pb.UNKNOWN
            recovery = await s.Read(pb.ReadRequest(stream_id=sid, entry_id=eid, term=3))
            assert recovery.code == pb.UNKNOWN
            rr = pb.ReadRangeRequest(stream_id=sid, first_entry_id=eid, last_entry_id=eid + 5)
            assert [r.code async for r in s.ReadRange(rr)][-1] == pb.UNKNOWN
        # Positives are served as usual, up to where the range stops.
        rr = pb.ReadRangeRequest(stream_id=1, first_entry_id=0, last_entry_id=5)
        responses = [r async for r in s.ReadRange(rr)]
        assert [e.entry_id for r in responses for e in r.entries] == [0, 1, 2]
        assert responses[-1].code == pb.UNKNOWN
        assert (await s.Read(pb.ReadRequest(stream_id=1, entry_id=2))).entry.payload == b"e2"
        fence = await s.Fence(pb.FenceRequest(stream_id=5, term=4))
        assert (fence.code, fence.bookie_term, fence.limbo) == (pb.OK, 4, True)
        poll = await s.ReadLac(pb.ReadLacRequest(stream_id=5, known_lac=-1, timeout_ms=0))
        assert (poll.code, poll.lac) == (pb.OK, -1)
        state = await s.StreamState(pb.StreamStateRequest(stream_id=5))
        assert (state.code, state.limbo) == (pb.OK, True)
        # Repaired: explicit negatives again.
        await asyncio.wrap_future(h.storage.set_limbo(1, False))
        assert (await s.Read(pb.ReadRequest(stream_id=1, entry_id=7))).code == pb.NO_SUCH_ENTRY
        assert (await s.Read(pb.ReadRequest(stream_id=9, entry_id=0))).code == pb.NO_SUCH_STREAM

    run(tmp_path, body)
