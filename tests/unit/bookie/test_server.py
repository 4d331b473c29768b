"""The gRPC service in-process over a fake storage engine: ordering of pipelined adds, waiting
for durability, long polls, malformed requests and internal errors."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from stream.bookie.config import BookieConfig
from stream.bookie.disk import DiskStatus
from stream.bookie.server import BookieService, StartReport, add_to_server, server_options
from stream.sandbox.zookeeper import free_port
from stream.wire import bookie_pb2 as pb
from stream.wire import bookie_pb2_grpc


@dataclass
class FakeState:
    term: int = 0
    limbo: bool = False
    lac: int = -1
    lafr: int = -1
    last_entry_id: int = -1
    first_entry_id: int = 0
    entries: dict[int, pb.Entry] = field(default_factory=dict)


@dataclass
class Outcome:
    code: int = pb.OK
    codes: list[int] = field(default_factory=list)
    bookie_term: int = 0
    durable: concurrent.futures.Future[Any] | None = None
    message: str = ""
    lac: int = -1
    lafr: int = -1
    last_entry_id: int = -1
    limbo: bool = False
    entry: pb.Entry | None = None
    first_entry_id: int = 0
    entry_ids: list[int] = field(default_factory=list)


class FakeJournal:
    """Completes durability futures in order on another thread, as the real journal does."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self._pending: list[concurrent.futures.Future[Any]] = []
        self._lock = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def submit(self) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            self._pending.append(fut)
            self._lock.notify()
        return fut

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._stop:
                    self._lock.wait()
                if self._stop:
                    return
                batch, self._pending = self._pending, []
            self.gate.wait()
            for fut in batch:
                fut.set_result(None)

    def close(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()


class FakeStorage:
    """Just enough of StreamStorage: term rule, entries, LAC, trim/truncate."""

    def __init__(self) -> None:
        self.streams: dict[int, FakeState] = {}
        self.journal = FakeJournal()
        self.on_lac_advanced: Any = None
        self.fail_next = False

    def _term_rule(self, stream_id: int, term: int) -> tuple[FakeState | None, bool]:
        state = self.streams.setdefault(stream_id, FakeState())
        if term < state.term:
            return None, False
        new = term > state.term
        state.term = term
        return state, new

    def add_batch(self, request: pb.AddRequest, raw: bytes | None = None) -> Outcome:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        state, _ = self._term_rule(request.stream_id, request.term)
        if state is None:
            term = self.streams[request.stream_id].term
            return Outcome(codes=[pb.INVALID_TERM] * len(request.entries), bookie_term=term)
        codes = []
        for e in request.entries:
            if e.entry_id < 0:
                codes.append(pb.BAD_REQUEST)
                continue
            state.entries[e.entry_id] = e
            state.last_entry_id = max(state.last_entry_id, e.entry_id)
            codes.append(pb.OK)
        if request.lac > state.lac:
            state.lac = request.lac
            if self.on_lac_advanced:
                self.on_lac_advanced(request.stream_id, state.lac)
        state.lafr = max(state.lafr, request.lafr)
        return Outcome(
            codes=codes or [pb.OK],
            bookie_term=state.term,
            durable=self.journal.submit(),
            entry_ids=[e.entry_id for e in request.entries],
        )

    def fence(self, stream_id: int, term: int) -> Outcome:
        state, new = self._term_rule(stream_id, term)
        if state is None:
            return Outcome(code=pb.INVALID_TERM, bookie_term=self.streams[stream_id].term)
        return Outcome(
            bookie_term=state.term,
            lac=state.lac,
            lafr=state.lafr,
            last_entry_id=state.last_entry_id,
            durable=self.journal.submit() if new else None,
        )

    def read(self, stream_id: int, entry_id: int, term: int = 0) -> Outcome:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        state = self.streams.get(stream_id)
        if state is None:
            return Outcome(code=pb.NO_SUCH_STREAM)
        if entry_id < state.first_entry_id:
            return Outcome(code=pb.TRIMMED, first_entry_id=state.first_entry_id)
        entry = state.entries.get(entry_id)
        return Outcome(code=pb.OK if entry else pb.NO_SUCH_ENTRY, entry=entry, lac=state.lac)

    def read_range(
        self, stream_id: int, first: int, last: int, max_batch_bytes: int
    ) -> Iterator[tuple[int, list[pb.Entry]]]:
        state = self.streams.get(stream_id)
        if state is None:
            yield pb.NO_SUCH_STREAM, []
            return
        batch: list[pb.Entry] = []
        size = 0
        for eid in range(first, last + 1):
            entry = state.entries.get(eid)
            if entry is None:
                yield pb.NO_SUCH_ENTRY, batch
                return
            if batch and size + len(entry.payload) > max_batch_bytes:
                yield pb.OK, batch
                batch, size = [], 0
            batch.append(entry)
            size += len(entry.payload)
        yield pb.OK, batch

    def lac(self, stream_id: int) -> tuple[int, int] | None:
        state = self.streams.get(stream_id)
        return None if state is None else (state.lac, state.lafr)

    def truncate(self, stream_id: int, term: int, after_entry_id: int) -> Outcome:
        state, _ = self._term_rule(stream_id, term)
        if state is None:
            return Outcome(code=pb.INVALID_TERM, bookie_term=self.streams[stream_id].term)
        for eid in [e for e in state.entries if e > after_entry_id]:
            del state.entries[eid]
        return Outcome(bookie_term=state.term, durable=self.journal.submit())

    def trim(self, stream_id: int, before_entry_id: int) -> Outcome:
        state = self.streams.setdefault(stream_id, FakeState())
        state.first_entry_id = max(state.first_entry_id, before_entry_id)
        return Outcome(first_entry_id=state.first_entry_id, durable=self.journal.submit())

    def stream_state(self, stream_id: int) -> FakeState | None:
        return self.streams.get(stream_id)

    def stream_ids(self) -> list[int]:
        return list(self.streams)


def entry(entry_id: int, payload: bytes = b"x") -> pb.Entry:
    return pb.Entry(entry_id=entry_id, payload=payload)


def add(stream_id: int, term: int, ids: range, lac: int = -1, rid: int = 0) -> pb.AddRequest:
    return pb.AddRequest(
        stream_id=stream_id,
        term=term,
        lac=lac,
        lafr=-1,
        request_id=rid,
        entries=[entry(i, f"e{i}".encode()) for i in ids],
    )


@dataclass
class Harness:
    storage: FakeStorage
    service: BookieService
    stub: bookie_pb2_grpc.BookieStub
    channel: grpc.aio.Channel


async def start(**overrides: Any) -> tuple[Harness, grpc.aio.Server]:
    port = free_port()
    config = BookieConfig.from_dict(
        {
            "bookie_id": "b1",
            "listen": f"127.0.0.1:{port}",
            "metadata": "127.0.0.1:1/x",
            "metrics_listen": "",
            **overrides,
        }
    )
    storage = FakeStorage()
    service = BookieService(
        config,
        storage,
        instance_id="inst",
        start_report=StartReport(unclean_start=True, replayed_records=7, replayed_entries=5),
        disk_status=DiskStatus(False, 10, 100, "/d", 0.1),
    )
    server = grpc.aio.server(options=server_options(config))
    add_to_server(service, server)
    server.add_insecure_port(config.listen)
    await server.start()
    channel = grpc.aio.insecure_channel(config.listen)
    return Harness(storage, service, bookie_pb2_grpc.BookieStub(channel), channel), server


def run(coro_fn: Any, **overrides: Any) -> None:
    async def main() -> None:
        h, server = await start(**overrides)
        try:
            await asyncio.wait_for(coro_fn(h), 20)
        finally:
            await h.channel.close()
            await server.stop(0)
            h.storage.journal.close()

    asyncio.run(main())


def test_pipelined_adds_answer_in_order_after_durability() -> None:
    async def body(h: Harness) -> None:
        h.storage.journal.gate.clear()  # hold the journal: nothing is durable yet
        sent = asyncio.Queue[pb.AddRequest | None]()

        async def requests() -> AsyncIterator[pb.AddRequest]:
            while (r := await sent.get()) is not None:
                yield r

        call = h.stub.Add(requests())
        for i in range(20):
            await sent.put(add(1, 1, range(i * 10, i * 10 + 10), rid=i))
        # All 20 batches reach storage before any is durable (pipelining)...
        deadline = time.monotonic() + 10
        while len(h.storage.streams.get(1, FakeState()).entries) < 200:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        # ...and none is answered until the journal syncs.
        read = asyncio.ensure_future(call.read())
        done, _ = await asyncio.wait({read}, timeout=0.2)
        assert not done
        h.storage.journal.gate.set()
        responses = [await read] + [await call.read() for _ in range(19)]
        await sent.put(None)
        assert [r.request_id for r in responses] == list(range(20))
        for i, r in enumerate(responses):
            assert list(r.entry_ids) == list(range(i * 10, i * 10 + 10))
            assert list(r.codes) == [pb.OK] * 10
            assert r.bookie_term == 1
        assert await call.read() == grpc.aio.EOF

    run(body)


def test_malformed_adds_are_refused_and_the_stream_goes_on() -> None:
    async def body(h: Harness) -> None:
        h.storage.fail_next = False
        requests = [
            add(0, 1, range(2)),  # stream 0
            add(1, 0, range(2)),  # term 0
            pb.AddRequest(stream_id=1, term=1, lac=-5, lafr=-1),  # lac below -1
            add(1, 2, range(3)),  # fine
            add(1, 1, range(3, 4)),  # lower term
        ]
        h.storage.fail_next = False
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

    run(body)


def test_internal_error_answers_internal_and_keeps_serving() -> None:
    async def body(h: Harness) -> None:
        h.storage.fail_next = True
        responses = [
            r async for r in h.stub.Add(iter([add(1, 1, range(2)), add(1, 1, range(2, 4))]))
        ]
        assert list(responses[0].codes) == [pb.INTERNAL] * 2
        assert "boom" in responses[0].message
        assert list(responses[1].codes) == [pb.OK] * 2
        h.storage.fail_next = True
        r = await h.stub.Read(pb.ReadRequest(stream_id=1, entry_id=0))
        assert r.code == pb.INTERNAL
        r = await h.stub.Read(pb.ReadRequest(stream_id=1, entry_id=2))
        assert r.code == pb.OK and r.entry.payload == b"e2"

    run(body)


def test_read_lac_long_poll_wakes_on_lac_advance() -> None:
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
        assert not h.service._lac_waiters

    run(body)


def test_read_lac_times_out_capped_and_unknown_stream() -> None:
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
        assert not h.service._lac_waiters

    run(body, read_lac_max_wait_ms=300)


def test_unary_requests_validate_and_answer() -> None:
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

    run(body)


def test_read_range_streams_batches() -> None:
    async def body(h: Harness) -> None:
        [r async for r in h.stub.Add(iter([add(1, 1, range(10), lac=9)]))]
        rr = pb.ReadRangeRequest(stream_id=1, first_entry_id=0, last_entry_id=20, max_batch_bytes=6)
        responses = [r async for r in h.stub.ReadRange(rr)]
        ids = [e.entry_id for r in responses for e in r.entries]
        assert ids == list(range(10))
        assert len(responses) > 1
        assert responses[-1].code == pb.NO_SUCH_ENTRY
        assert all(r.lac == 9 for r in responses)

    run(body)


def test_read_only_refuses_adds_and_truncates_but_not_recovery() -> None:
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

    run(body)


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
def test_garbage_bytes_answer_bad_request(method: str, response_type: Any) -> None:
    async def body(h: Harness) -> None:
        call = h.channel.unary_unary(f"/streamkeeper.v1.Bookie/{method}")
        response = response_type.FromString(await call(b"\xff\xff\xff\xff\x0f garbage"))
        assert response.code == pb.BAD_REQUEST
        assert "malformed" in response.message

    run(body)


def test_garbage_bytes_on_streams_and_info() -> None:
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

    run(body)
