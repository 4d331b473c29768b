"""The simulated network: ordered Add streams that break as a whole, independent unary calls
(lost, duplicated, reordered), cut and clogged links, crashes, and seeded determinism."""

from __future__ import annotations

import asyncio
import random

import pytest

from stream.client.ports import AddBatch, answered_ids
from stream.framing.prepare import prepare_entry
from stream.protocol import Code
from stream.sim.bookie import SimBookie
from stream.sim.loop import run_simulated
from stream.sim.network import NetworkError, NetworkFaults, SimNetwork, SimTransport
from stream.sim.trace import Trace
from stream.wire import bookie_pb2 as pb

S = 3


def _world(faults: NetworkFaults | None = None, seed: int = 1) -> tuple[SimNetwork, SimBookie]:
    loop = asyncio.get_running_loop()
    trace = Trace(loop.time)
    network = SimNetwork(loop, random.Random(seed), trace, faults or NetworkFaults())
    bookie = SimBookie("b1", trace=trace)
    network.bookies["b1"] = bookie
    return network, bookie


def _batch(*ids: int, term: int = 1) -> AddBatch:
    entries = [prepare_entry(S, i, 0, 0, f"e{i}".encode()) for i in ids]
    return AddBatch(stream_id=S, term=term, lac=-1, lafr=-1, entries=entries)


def test_add_stream_answers_in_order_despite_latency_spikes() -> None:
    async def run() -> list[list[int]]:
        network, _ = _world(NetworkFaults(spike_rate=0.5, spike_max_s=0.05))
        stream = SimTransport(network, "c1").open_add_stream("b1")
        futures = [stream.send(_batch(i)) for i in range(20)]
        return [list(answered_ids(await f)) for f in futures]  # b1 answers with ranges

    assert run_simulated(run()) == [[i] for i in range(20)]


def test_a_lost_message_breaks_the_whole_stream() -> None:
    async def run() -> tuple[int, int, bool]:
        network, bookie = _world(NetworkFaults(loss_rate=0.2), seed=3)
        stream = SimTransport(network, "c1").open_add_stream("b1")
        futures = [stream.send(_batch(i)) for i in range(30)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        answered = [r for r in results if not isinstance(r, BaseException)]
        failed_after = stream.send(_batch(99))
        with pytest.raises(NetworkError):
            await failed_after
        # Answered ones are a prefix: after the first failure, nothing is answered.
        first_failure = next(i for i, r in enumerate(results) if isinstance(r, BaseException))
        prefix = all(isinstance(r, BaseException) for r in results[first_failure:])
        return len(answered), first_failure, prefix

    answered, first_failure, prefix = run_simulated(run())
    assert answered == first_failure < 30 and prefix


def test_clogged_link_holds_messages_then_delivers_them_in_order() -> None:
    async def run() -> tuple[bool, list[int], float]:
        network, _ = _world()
        loop = asyncio.get_running_loop()
        network.clog("c1", "b1")
        stream = SimTransport(network, "c1").open_add_stream("b1")
        futures = [stream.send(_batch(i)) for i in range(5)]
        await asyncio.sleep(1.0)
        held = not any(f.done() for f in futures)
        network.restore("c1", "b1")
        answers = await asyncio.gather(*futures)
        return held, [answered_ids(a)[0] for a in answers], loop.time()

    held, ids, at = run_simulated(run())
    assert held and ids == [0, 1, 2, 3, 4] and at < 1.1


def test_cut_link_drops_unary_calls_and_breaks_streams() -> None:
    async def run() -> None:
        network, _ = _world()
        transport = SimTransport(network, "c1")
        stream = transport.open_add_stream("b1")
        first = stream.send(_batch(0))
        await first
        network.cut("c1", "b1", 5.0)
        with pytest.raises(NetworkError):
            await stream.send(_batch(1))
        with pytest.raises(TimeoutError):
            await transport.fence("b1", S, 1, timeout_s=0.5)
        await asyncio.sleep(5.0)
        assert (await transport.fence("b1", S, 1, timeout_s=0.5)).code == Code.OK

    run_simulated(run())


def test_crash_breaks_connected_streams_and_refuses_calls() -> None:
    async def run() -> None:
        network, bookie = _world()
        transport = SimTransport(network, "c1")
        used = transport.open_add_stream("b1")
        await used.send(_batch(0))
        unused = transport.open_add_stream("b1")
        bookie.crash()
        network.break_streams("b1", "crash")
        with pytest.raises(NetworkError):
            await used.send(_batch(1))
        with pytest.raises(NetworkError):
            await transport.read("b1", S, 0, timeout_s=1.0)
        bookie.start()
        # A stream that never sent connects lazily, to the new incarnation.
        assert list((await unused.send(_batch(1))).codes) == [Code.OK]

    run_simulated(run())


def test_repeatable_requests_may_be_served_twice() -> None:
    async def run() -> int:
        network, bookie = _world(NetworkFaults(duplicate_rate=1.0))
        transport = SimTransport(network, "c1")
        served = []
        original = bookie.fence

        def counting(request: pb.FenceRequest) -> pb.FenceResponse:
            served.append(request.term)
            return original(request)

        bookie.fence = counting  # type: ignore[method-assign]
        await transport.fence("b1", S, 1, timeout_s=1.0)
        await asyncio.sleep(0.1)
        return len(served)

    assert run_simulated(run()) == 2


def test_same_seed_same_trace() -> None:
    async def run(seed: int) -> str:
        network, _ = _world(NetworkFaults(spike_rate=0.3, loss_rate=0.05), seed=seed)
        transport = SimTransport(network, "c1")
        calls = [transport.read("b1", S, i, timeout_s=0.2) for i in range(30)]
        await asyncio.gather(*calls, return_exceptions=True)
        stream = transport.open_add_stream("b1")
        await asyncio.gather(*(stream.send(_batch(i)) for i in range(30)), return_exceptions=True)
        return network.trace.digest()

    assert run_simulated(run(5)) == run_simulated(run(5))
    assert run_simulated(run(5)) != run_simulated(run(6))
