"""The add pipeline's linger (`WriterOptions.batch_linger_s`): a batch smaller than
`pipelined_batch_min_entries` goes out no sooner than the linger after the bookie's previous
batch, so that fast answers do not shrink the batches; an add after a quiet spell, and a full
batch, go at once. Run on the simulator's virtual-time loop: exact times, no real waiting."""

from __future__ import annotations

import asyncio

from stream.client.options import WriterOptions
from stream.client.pipeline import AddPipeline
from stream.framing.prepare import prepare_entries
from stream.protocol import FragmentEnsemble, QuorumConfig
from stream.sim.loop import run_simulated
from tests.unit.client.pipeline_support import RecordingTransport, StrictOwner

BOOKIES = ("b1", "b2", "b3")
LINGER_S = 0.05


def _pipeline(transport: RecordingTransport, owner: StrictOwner, **options: float) -> AddPipeline:
    return AddPipeline(
        transport=transport,  # type: ignore[arg-type]
        owner=owner,
        stream_id=1,
        term=1,
        config=QuorumConfig(3, 3, 2),
        fragments=[FragmentEnsemble(0, BOOKIES)],
        last_entry_id=-1,
        options=WriterOptions(pipelined_batch_min_entries=4, **options),  # type: ignore[arg-type]
        max_in_flight=100,
    )


def _run(linger_s: float) -> tuple[list[tuple[float, int]], list[float], list[int]]:
    """Adds 1 entry, 3 right after its answer, a full batch of 4 later and 1 right after it,
    1 after a quiet spell, then 1 and 4 (a full batch with the lingering one); returns the
    batches one bookie got (time, entries), the times of the adds, and the acknowledged ids."""

    async def main() -> tuple[list[tuple[float, int]], list[float], list[int]]:
        loop = asyncio.get_running_loop()
        transport, owner = RecordingTransport(), StrictOwner()
        pipeline = _pipeline(transport, owner, batch_linger_s=linger_s)
        added: list[float] = []

        def add(count: int) -> None:
            first = pipeline.next_entry_id
            pipeline.add_run(prepare_entries(1, first, 0, [b"x"] * count))
            added.append(loop.time())
            pipeline.flush()

        for pause_s, count in ((0.0, 1), (0.001, 3), (LINGER_S * 2, 4), (0.001, 1)):
            await asyncio.sleep(pause_s)
            add(count)
        await asyncio.sleep(LINGER_S * 3)
        add(1)
        for pause_s, count in ((0.001, 1), (0.001, 4)):
            await asyncio.sleep(pause_s)
            add(count)
        await asyncio.sleep(LINGER_S * 2)
        pipeline.close()
        sent = [(t, len(b.entries)) for t, bookie, b in transport.sent if bookie == BOOKIES[0]]
        return sent, added, owner.acknowledged

    return run_simulated(main())


def test_small_batches_linger_after_the_previous_one() -> None:
    sent, added, acknowledged = _run(LINGER_S)
    assert acknowledged == list(range(15))
    assert [n for _, n in sent] == [1, 3, 4, 1, 1, 5]
    times = [t for t, _ in sent]
    assert times[0] == added[0]  # the first add goes at once
    assert times[1] == times[0] + LINGER_S  # the next small batch waits for the linger
    assert times[2] == added[2]  # a full batch does not wait
    assert times[3] == times[2] + LINGER_S
    assert times[4] == added[4]  # after a quiet spell: at once
    assert times[5] == added[6]  # the lingering entry goes with a full batch, at once


def test_no_linger_sends_at_once() -> None:
    sent, added, acknowledged = _run(0.0)
    assert acknowledged == list(range(15))
    assert sent == [(t, n) for t, n in zip(added, [1, 3, 4, 1, 1, 1, 4], strict=True)]


def test_a_slow_answer_does_not_hold_the_next_batch() -> None:
    """Answers take three lingers: a small batch goes out beside the one in flight once the
    linger has passed, not when the answer comes (the latency's tail would be two round
    trips), up to `inflight_batches_per_bookie`; without a linger it waits for the answer."""

    def sent_at(linger_s: float) -> list[float]:
        async def main() -> list[float]:
            loop = asyncio.get_running_loop()
            transport, owner = RecordingTransport(answer_after_s=LINGER_S * 3), StrictOwner()
            pipeline = _pipeline(
                transport, owner, batch_linger_s=linger_s, inflight_batches_per_bookie=2
            )
            start = loop.time()
            for at in (0.0, 0.001, LINGER_S + 0.001):
                await asyncio.sleep(start + at - loop.time())
                pipeline.add_run(prepare_entries(1, pipeline.next_entry_id, 0, [b"x"]))
                pipeline.flush()
            await asyncio.sleep(LINGER_S * 10)
            pipeline.close()
            assert owner.acknowledged == [0, 1, 2]
            return [round(t - start, 6) for t, b, _ in transport.sent if b == BOOKIES[0]]

        return run_simulated(main())

    # Entry 0 at once; entry 1 one linger later, beside it; entry 2 (two in flight) when
    # the first answer comes.
    assert sent_at(LINGER_S) == [0.0, LINGER_S, round(LINGER_S * 3, 6)]
    # Without a linger, entries 1 and 2 wait for that answer.
    assert sent_at(0.0) == [0.0, round(LINGER_S * 3, 6)]
