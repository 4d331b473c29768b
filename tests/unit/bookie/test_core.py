"""The bookie's transport-neutral request handling (`BookieCore`) against its gRPC edge: the
same seeded request sequences, sent through a real gRPC server to one storage and handed to a
core over another, get the same answers (the edge adds nothing but transport). Then the core
without gRPC or threads: over the simulated disk, on the simulator's virtual-time loop, its
journal commits run as the simulator's jobs."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from stream.bookie.config import BookieConfig
from stream.bookie.core import BookieCore
from stream.bookie.disk import DiskStatus
from stream.bookie.server import StartReport
from stream.bookie.storage import StreamStorage
from stream.bookie.storage.write_cache import ENTRY_OVERHEAD_BYTES
from stream.sim.disk import SimDisk
from stream.sim.loop import run_simulated
from stream.wire import bookie_pb2 as pb

from .test_server import Harness, add, run

_START = StartReport(unclean_start=True, replayed_records=7, replayed_entries=5)
_WRITABLE = DiskStatus(False, 10, 100, "/d", 0.1)
_FULL = DiskStatus(True, 1, 100, "/d", 0.99)


def _requests(seed: int) -> list[tuple[str, Any]]:
    """Returns a seeded sequence of (rpc, request) over two streams, terms going up and
    sometimes down, with read-only spells."""
    rng = random.Random(seed)
    out: list[tuple[str, Any]] = []
    next_id = {1: 0, 2: 0}
    for _ in range(60):
        stream = rng.choice([1, 2])
        term = rng.choice([1, 1, 2, 3])
        kind = rng.choice(
            ["add"] * 4
            + ["fence", "read", "rread", "lac", "truncate", "trim", "state", "range"]
            + ["disk"]
        )
        if kind == "add":
            first = next_id[stream]
            n = rng.randint(0, 3)
            next_id[stream] += n
            out.append(("add", add(stream, term, range(first, first + n), lac=first - 1)))
        elif kind == "fence":
            out.append(("fence", pb.FenceRequest(stream_id=stream, term=term)))
        elif kind in ("read", "rread"):
            entry_id = rng.randint(0, next_id[stream] + 1)
            t = term if kind == "rread" else 0
            out.append(("read", pb.ReadRequest(stream_id=stream, entry_id=entry_id, term=t)))
        elif kind == "lac":
            out.append(("lac", pb.ReadLacRequest(stream_id=stream, known_lac=-1, timeout_ms=0)))
        elif kind == "truncate":
            after = rng.randint(-1, next_id[stream])
            out.append(
                ("truncate", pb.TruncateRequest(stream_id=stream, term=term, after_entry_id=after))
            )
        elif kind == "trim":
            before = rng.randint(0, max(next_id[stream] - 2, 0))
            out.append(("trim", pb.TrimRequest(stream_id=stream, before_entry_id=before)))
        elif kind == "state":
            out.append(("state", pb.StreamStateRequest(stream_id=stream)))
        elif kind == "range":
            first = rng.randint(0, next_id[stream])
            request = pb.ReadRangeRequest(
                stream_id=stream, first_entry_id=first, last_entry_id=first + rng.randint(0, 5)
            )
            out.append(("range", request))
        else:
            out.append(("disk", rng.random() < 0.5))
    return out


async def _through_grpc(h: Harness, rpc: str, request: Any) -> Any:
    stub = h.stub
    if rpc == "add":

        async def one() -> AsyncIterator[pb.AddRequest]:
            yield request

        return [r async for r in stub.Add(one())]
    if rpc == "range":
        return [r async for r in stub.ReadRange(request)]
    if rpc == "disk":
        h.service.set_disk_status(_FULL if request else _WRITABLE)
        return None
    method = {
        "fence": stub.Fence,
        "read": stub.Read,
        "lac": stub.ReadLac,
        "truncate": stub.Truncate,
        "trim": stub.Trim,
        "state": stub.StreamState,
    }[rpc]
    return await method(request)


async def _through_core(core: BookieCore, rpc: str, request: Any) -> Any:
    if rpc == "add":
        return [await core.add(request)]
    if rpc == "range":
        responses = []
        for head, entries in core.read_range(request):
            head.entries.extend(entries)
            responses.append(head)
        return responses
    if rpc == "disk":
        core.set_disk_status(_FULL if request else _WRITABLE)
        return None
    method = {
        "fence": core.fence,
        "read": core.read,
        "lac": core.read_lac,
        "truncate": core.truncate,
        "trim": core.trim,
        "state": core.stream_state,
    }[rpc]
    return await method(request)


@pytest.mark.parametrize("seed", range(6))
def test_the_core_answers_as_the_grpc_service(tmp_path: Path, seed: int) -> None:
    requests = _requests(seed)

    async def body(h: Harness) -> None:
        config = dataclasses.replace(h.storage.config, data_dir=str(tmp_path / "core"))
        storage = StreamStorage(config)
        storage.open()
        core = BookieCore(
            config, storage, instance_id="inst", start_report=_START, disk_status=_WRITABLE
        )
        try:
            for step, (rpc, request) in enumerate(requests):
                via_grpc = await _through_grpc(h, rpc, request)
                direct = await _through_core(core, rpc, request)
                assert via_grpc == direct, f"step {step}: {rpc} {request}"
        finally:
            storage.close()

    run(tmp_path / "grpc", body)


def test_the_core_serves_without_grpc_or_threads_on_virtual_time() -> None:
    """Over the simulated disk, with the storage's jobs run by a task of the virtual-time
    loop: an add is answered once the journal job committed it, and the term rule and limbo
    answer as on the real bookie."""
    disk = SimDisk(random.Random(1))
    config = BookieConfig(
        bookie_id="b1", listen="127.0.0.1:1", metadata="127.0.0.1:2181/x", data_dir="/sim/b1"
    )

    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        storage = StreamStorage(config, disk=disk, clock=loop.time, threads=False)
        storage.open()
        core = BookieCore(config, storage, instance_id="i", start_report=_START)
        answered = asyncio.ensure_future(core.add(add(1, 2, range(3), lac=-1)))
        await asyncio.sleep(0.01)
        assert not answered.done()  # not durable: the journal job has not run
        storage.commit_journal()
        first = await answered
        stale = await core.add(add(1, 1, range(3, 4)))  # a lower term: refused, no journal
        missing = await core.read(pb.ReadRequest(stream_id=1, entry_id=7))
        fence = asyncio.ensure_future(core.fence(pb.FenceRequest(stream_id=1, term=3)))
        await asyncio.sleep(0)
        storage.commit_journal()
        fenced = await fence
        storage.close()
        return [first, stale, missing, fenced]

    first, stale, missing, fenced = run_simulated(main())
    assert list(first.codes) == [pb.OK] * 3 and first.bookie_term == 2
    assert list(stale.codes) == [pb.INVALID_TERM] and stale.bookie_term == 2
    assert missing.code == pb.NO_SUCH_ENTRY
    assert fenced.code == pb.OK and fenced.bookie_term == 3 and fenced.last_entry_id == 2


def test_add_answers_are_counted_and_scraped() -> None:
    """The Add counters (plain numbers read when scraped) and the write cache gauge (read
    from the storage when scraped) show what the adds did."""
    disk = SimDisk(random.Random(2))
    config = BookieConfig(
        bookie_id="b2", listen="127.0.0.1:1", metadata="127.0.0.1:2181/x", data_dir="/sim/b2"
    )

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = {
        "batches": sample("streamkeeper_bookie_add_batches_total"),
        "ok": sample("streamkeeper_bookie_add_entries_total", code="OK"),
        "term": sample("streamkeeper_bookie_add_entries_total", code="INVALID_TERM"),
        "requests": sample("streamkeeper_bookie_requests_total", rpc="Add", code="OK"),
    }

    async def main() -> float:
        loop = asyncio.get_running_loop()
        storage = StreamStorage(config, disk=disk, clock=loop.time, threads=False)
        storage.open()
        core = BookieCore(config, storage, instance_id="i", start_report=_START)
        answered = asyncio.ensure_future(core.add(add(1, 2, range(3), lac=-1)))
        await asyncio.sleep(0)
        storage.commit_journal()
        await answered
        await core.add(add(1, 1, range(3, 5)))  # a lower term: two entries refused
        cached = sample("streamkeeper_bookie_write_cache_bytes")
        storage.close()
        return cached

    cached = run_simulated(main())
    assert sample("streamkeeper_bookie_add_batches_total") - before["batches"] == 2
    assert sample("streamkeeper_bookie_add_entries_total", code="OK") - before["ok"] == 3
    assert (
        sample("streamkeeper_bookie_add_entries_total", code="INVALID_TERM") - before["term"] == 2
    )
    assert (
        sample("streamkeeper_bookie_requests_total", rpc="Add", code="OK") - before["requests"] == 1
    )
    assert cached >= 3 * ENTRY_OVERHEAD_BYTES
