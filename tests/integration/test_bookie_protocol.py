"""Real bookie processes over gRPC: ReadLac long polls, read-only mode, and a protocol fuzz of
every RPC that must leave the bookie serving with its acknowledged data intact."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from kazoo.client import KazooClient

from stream.metadata import paths
from stream.protocol.checksum import entry_checksum
from stream.sandbox.bookies import BookieProcess
from stream.wire import bookie_pb2 as pb
from tests.integration.bookie_support import (
    METADATA_UNCHECKED,
    BookieFactory,
    add_all,
    add_request,
    make_entry,
    payload_of,
    wait_until,
)

pytestmark = pytest.mark.integration

STREAM = 11


@pytest.fixture
def bookies(tmp_path: Path, metadata_root: str) -> Iterator[BookieFactory]:
    factory = BookieFactory(tmp_path, metadata_root, unsafe_skips=METADATA_UNCHECKED)
    try:
        yield factory
    finally:
        factory.stop_all()


def test_read_lac_returns_as_soon_as_the_lac_moves(bookies: BookieFactory) -> None:
    bookie = bookies.start("bookie-1", read_lac_max_wait_ms=120_000)
    stub = bookie.stub()
    add_all(stub, [add_request(STREAM, 1, range(5), lac=3, lafr=3)])

    poll_timeout_ms = 60_000
    started = time.monotonic()
    poll = stub.ReadLac.future(
        pb.ReadLacRequest(stream_id=STREAM, known_lac=3, timeout_ms=poll_timeout_ms), timeout=90
    )
    # The LAC has not moved: the poll is parked at the bookie.
    time.sleep(0.3)
    assert not poll.done()
    # An explicit LAC (an empty batch) moves it.
    add_all(stub, [pb.AddRequest(stream_id=STREAM, term=1, lac=4, lafr=4)])
    response = poll.result(timeout=30)
    assert (response.code, response.lac, response.lafr) == (pb.OK, 4, 4)
    assert time.monotonic() - started < poll_timeout_ms / 1000 / 2

    # A poll behind the LAC answers at once; one at the LAC waits out its own timeout.
    behind = stub.ReadLac(pb.ReadLacRequest(stream_id=STREAM, known_lac=1, timeout_ms=60_000))
    assert (behind.code, behind.lac) == (pb.OK, 4)
    waited = stub.ReadLac(
        pb.ReadLacRequest(stream_id=STREAM, known_lac=4, timeout_ms=200), timeout=30
    )
    assert (waited.code, waited.lac) == (pb.OK, 4)

    # A poll woken by an add of entries with a higher LAC.
    poll = stub.ReadLac.future(
        pb.ReadLacRequest(stream_id=STREAM, known_lac=4, timeout_ms=poll_timeout_ms), timeout=90
    )
    time.sleep(0.2)
    assert not poll.done()
    add_all(stub, [add_request(STREAM, 1, range(5, 10), lac=8, lafr=6)])
    assert poll.result(timeout=30).lac == 8


def test_read_lac_wait_is_capped(bookies: BookieFactory) -> None:
    bookie = bookies.start("bookie-1", read_lac_max_wait_ms=500)
    stub = bookie.stub()
    add_all(stub, [add_request(STREAM, 1, range(1), lac=0)])
    response = stub.ReadLac(
        pb.ReadLacRequest(stream_id=STREAM, known_lac=0, timeout_ms=600_000), timeout=30
    )
    assert (response.code, response.lac) == (pb.OK, 0)
    unknown = stub.ReadLac(pb.ReadLacRequest(stream_id=999, known_lac=-1, timeout_ms=0))
    assert unknown.code == pb.NO_SUCH_STREAM


def test_read_only_bookie_refuses_adds(bookies: BookieFactory, metadata_root: str) -> None:
    # Any disk is used above 0.1 %: the bookie is read-only from the start.
    bookie = bookies.start("bookie-1", disk_usage_threshold=0.001, disk_check_interval_ms=200)
    stub = bookie.stub()
    info = stub.Info(pb.InfoRequest(), timeout=10)
    assert info.read_only and info.free_bytes > 0
    [r] = add_all(stub, [add_request(STREAM, 1, range(3))])
    assert list(r.codes) == [pb.READ_ONLY] * 3
    t = stub.Truncate(pb.TruncateRequest(stream_id=STREAM, term=1, after_entry_id=-1))
    assert t.code == pb.READ_ONLY
    # A recovery write-back is still taken: a takeover must be able to finish.
    [r] = add_all(stub, [add_request(STREAM, 1, range(2), recovery=True)])
    assert list(r.codes) == [pb.OK] * 2
    read = stub.Read(pb.ReadRequest(stream_id=STREAM, entry_id=1), timeout=10)
    assert read.code == pb.OK
    zk = KazooClient(hosts=metadata_root)
    zk.start(timeout=10)
    try:
        node = paths.BOOKIES_AVAILABLE + "/bookie-1"
        data = wait_until(lambda: zk.exists(node) and zk.get(node)[0], 20, "registration")
        assert b"read_only" in data and b"true" in data
    finally:
        zk.stop()
        zk.close()


# -- fuzz ----------------------------------------------------------------------------------

UNARY = {
    "Fence": pb.FenceRequest,
    "Read": pb.ReadRequest,
    "ReadLac": pb.ReadLacRequest,
    "Truncate": pb.TruncateRequest,
    "Trim": pb.TrimRequest,
    "StreamState": pb.StreamStateRequest,
    "Info": pb.InfoRequest,
}
RESPONSES = {
    "Fence": pb.FenceResponse,
    "Read": pb.ReadResponse,
    "ReadLac": pb.ReadLacResponse,
    "Truncate": pb.TruncateResponse,
    "Trim": pb.TrimResponse,
    "StreamState": pb.StreamStateResponse,
    "Info": pb.InfoResponse,
}
PROTECTED = 424242  # the stream whose acknowledged data must survive the fuzz
U64 = [0, 1, 2, 3, 2**31, 2**32 + 1, 2**63 - 1, 2**63, 2**64 - 1]
I64 = [-(2**63), -(2**31), -2, -1, 0, 1, 2, 7, 1000, 2**31, 2**62, 2**63 - 2, 2**63 - 1]


def rand_u64(rng: random.Random) -> int:
    return rng.choice(U64) if rng.random() < 0.7 else rng.randrange(2**64)


def rand_i64(rng: random.Random) -> int:
    return rng.choice(I64) if rng.random() < 0.7 else rng.randrange(-(2**63), 2**63)


def rand_stream(rng: random.Random) -> int:
    stream_id = rng.choice([0, 1, 2, 3, 2**63, 2**64 - 1, rng.randrange(2**64)])
    return stream_id if stream_id != PROTECTED else 1


def rand_entry(rng: random.Random, stream_id: int) -> pb.Entry:
    payload = rng.randbytes(rng.choice([0, 1, 17, 1000, 70_000]))
    entry_id = rng.choice([rand_i64(rng), rng.randrange(0, 50)])
    flags = rng.choice([0, 1, 2, 3, 4, 255, 2**32 - 1])
    timestamp_ms = rand_i64(rng)
    crc = rng.randrange(2**32)
    if rng.random() < 0.5:
        try:
            crc = entry_checksum(stream_id, entry_id, flags, timestamp_ms, payload)
        except Exception:  # an id outside the header's range: keep the random checksum
            pass
    return pb.Entry(
        entry_id=entry_id, flags=flags, timestamp_ms=timestamp_ms, payload=payload, crc32c=crc
    )


def rand_add(rng: random.Random) -> pb.AddRequest:
    stream_id = rand_stream(rng)
    return pb.AddRequest(
        stream_id=stream_id,
        term=rng.choice([0, 1, rand_u64(rng)]),
        lac=rand_i64(rng),
        lafr=rand_i64(rng),
        recovery=rng.random() < 0.3,
        request_id=rand_u64(rng),
        entries=[rand_entry(rng, stream_id) for _ in range(rng.choice([0, 1, 3, 40]))],
    )


def rand_unary(rng: random.Random, method: str) -> object:
    kind = UNARY[method]
    fields: dict[str, int] = {}
    for f in kind.DESCRIPTOR.fields:
        if f.name == "stream_id":
            fields[f.name] = rand_stream(rng)
        elif f.name == "timeout_ms":
            fields[f.name] = rng.choice([0, 1, 50])  # keep the fuzz fast
        elif f.type == f.TYPE_UINT64 or f.type == f.TYPE_UINT32:
            fields[f.name] = rand_u64(rng) % (2**32 if f.type == f.TYPE_UINT32 else 2**64)
        else:
            fields[f.name] = rand_i64(rng)
    return kind(**fields)


def acknowledged(bookie: BookieProcess) -> list[int]:
    requests = [
        add_request(PROTECTED, 3, range(i, i + 20), lac=i - 1, size=300) for i in range(0, 200, 20)
    ]
    responses = add_all(bookie.stub(), requests)
    return [i for r in responses for i, c in zip(r.entry_ids, r.codes, strict=True) if c == pb.OK]


def check_intact(bookie: BookieProcess, acked: list[int]) -> None:
    stub = bookie.stub()
    info = stub.Info(pb.InfoRequest(), timeout=10)
    assert info.bookie_id == "bookie-1"
    for entry_id in acked:
        r = stub.Read(pb.ReadRequest(stream_id=PROTECTED, entry_id=entry_id), timeout=10)
        assert r.code == pb.OK, (entry_id, r)
        assert r.entry == make_entry(PROTECTED, entry_id, payload_of(PROTECTED, entry_id, 300))
    state = stub.StreamState(pb.StreamStateRequest(stream_id=PROTECTED), timeout=10)
    assert (state.term, state.last_entry_id) == (3, 199)


def raw_calls(channel: grpc.Channel) -> dict[str, object]:
    base = "/streamkeeper.v1.Bookie/"
    calls: dict[str, object] = {m: channel.unary_unary(base + m) for m in UNARY}
    calls["Add"] = channel.stream_stream(base + "Add")
    calls["ReadRange"] = channel.unary_stream(base + "ReadRange")
    return calls


def test_fuzz_every_rpc_leaves_bookie_serving_and_data_intact(bookies: BookieFactory) -> None:
    bookie = bookies.start("bookie-1", max_entry_bytes=65_536, read_lac_max_wait_ms=100)
    acked = acknowledged(bookie)
    assert len(acked) == 200
    rng = random.Random(20240601)
    stub = bookie.stub()
    raw = raw_calls(bookie.channel)
    answered = {name: 0 for name in [*UNARY, "Add", "ReadRange"]}

    def garbage() -> bytes:
        return rng.randbytes(rng.choice([1, 2, 5, 30, 300, 5000]))

    for round_ in range(120):
        # Random bytes as raw request payloads to every RPC: BAD_REQUEST (or, when the bytes
        # happen to parse, an ordinary answer); Info has no code and fails INVALID_ARGUMENT.
        for method in UNARY:
            try:
                data = raw[method](garbage(), timeout=5)  # type: ignore[operator]
            except grpc.RpcError as e:
                assert method == "Info" and e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
                continue
            response = RESPONSES[method].FromString(data)
            if method != "Info":
                assert response.code not in (pb.CODE_UNSPECIFIED, pb.INTERNAL), response
            answered[method] += 1
        for data in raw["ReadRange"](garbage(), timeout=5):  # type: ignore[operator]
            response = pb.ReadRangeResponse.FromString(data)
            assert response.code not in (pb.CODE_UNSPECIFIED, pb.INTERNAL), response
        answered["ReadRange"] += 1
        batches = [garbage() for _ in range(3)]
        garbage_responses = list(raw["Add"](iter(batches), timeout=5))  # type: ignore[operator]
        assert len(garbage_responses) == len(batches)
        for data in garbage_responses:
            assert pb.INTERNAL not in pb.AddResponse.FromString(data).codes

        # Well-formed messages with random field values: always a clean answer with a code.
        for method in UNARY:
            request = rand_unary(rng, method)
            response = getattr(stub, method)(request, timeout=10)
            answered[method] += 1
            if method != "Info":
                assert response.code != pb.CODE_UNSPECIFIED, (method, request)
                assert response.code != pb.INTERNAL, (method, request, response)
        range_request = pb.ReadRangeRequest(
            stream_id=rand_stream(rng),
            first_entry_id=rand_i64(rng),
            last_entry_id=rand_i64(rng),
            max_batch_bytes=rng.choice([0, 1, 100, 2**32 - 1]),
        )
        for response in stub.ReadRange(range_request, timeout=10):
            assert response.code not in (pb.CODE_UNSPECIFIED, pb.INTERNAL), response
        answered["ReadRange"] += 1

        batches = [rand_add(rng) for _ in range(rng.choice([1, 2, 5]))]
        call = stub.Add(iter(batches), timeout=20)
        if round_ % 4 == 3:
            # Cancel the stream early, responses unread.
            call.cancel()
            continue
        responses = list(call)
        assert len(responses) == len(batches)
        for request, response in zip(batches, responses, strict=True):
            assert response.request_id == request.request_id
            assert len(response.codes) in (1, len(request.entries))
            assert pb.INTERNAL not in response.codes, (request.stream_id, response)
        answered["Add"] += 1

    assert bookie.running, bookie.log_tail()
    assert all(answered.values()), answered
    check_intact(bookie, acked)
    # And the acknowledged data survives a restart after the fuzz.
    bookie.kill9()
    bookie.start()
    bookie.wait_ready()
    check_intact(bookie, acked)
