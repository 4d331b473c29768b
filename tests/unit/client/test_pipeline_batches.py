"""What the add pipeline sends each bookie: every batch's bytes are the AddRequest of that
batch's own entries, when the bookies of a write set share one join of the entries (E = WQ)
and when each bookie gets its own stripes (E > WQ: batches with the same first and last entry
and count may hold different entries)."""

from __future__ import annotations

import asyncio

import pytest

from stream.client.options import WriterOptions
from stream.client.pipeline import AddPipeline
from stream.client.ports import AddBatch
from stream.framing.prepare import prepare_entries
from stream.protocol import FragmentEnsemble, QuorumConfig
from stream.sim.loop import run_simulated
from stream.wire import bookie_pb2 as pb
from stream.wire.frames import length_prefix
from tests.unit.client.pipeline_support import RecordingTransport, StrictOwner


def _sent(
    config: QuorumConfig, runs: list[int], *, ranged: bool = False
) -> tuple[list[tuple[str, AddBatch]], list[int]]:
    """Adds runs of `runs[i]` entries (each flushed at once, no linger) on an ensemble of
    `config.ensemble` bookies answering OK (with `ranged`, consecutive ids as a range);
    returns the batches sent and the acknowledged ids."""

    async def main() -> tuple[list[tuple[str, AddBatch]], list[int]]:
        transport, owner = RecordingTransport(ranged=ranged), StrictOwner()
        bookies = tuple(f"b{i}" for i in range(config.ensemble))
        pipeline = AddPipeline(
            transport=transport,  # type: ignore[arg-type]
            owner=owner,
            stream_id=1,
            term=1,
            config=config,
            fragments=[FragmentEnsemble(0, bookies)],
            last_entry_id=-1,
            options=WriterOptions(batch_linger_s=0),
            max_in_flight=1000,
        )
        for count in runs:
            first = pipeline.next_entry_id
            payloads = [b"p%d" % (first + i) for i in range(count)]
            pipeline.add_run(prepare_entries(1, first, 0, payloads))
            pipeline.flush()
            await asyncio.sleep(0)
        pipeline.close()
        return [(bookie, batch) for _, bookie, batch in transport.sent], owner.acknowledged

    return run_simulated(main())


@pytest.mark.parametrize("ranged", [False, True])
@pytest.mark.parametrize(
    "config", [QuorumConfig(3, 3, 2), QuorumConfig(4, 3, 2), QuorumConfig(5, 2, 2)]
)
def test_every_batch_carries_its_own_entries(config: QuorumConfig, ranged: bool) -> None:
    runs = [1, 4, 4, 7, 2, 12, 3, 4]
    sent, acknowledged = _sent(config, runs, ranged=ranged)
    assert acknowledged == list(range(sum(runs)))
    for _, batch in sent:
        request = pb.AddRequest.FromString(batch.to_bytes())
        assert [e.entry_id for e in request.entries] == [e.entry_id for e in batch.entries]
        assert [e.payload for e in request.entries] == [b"p%d" % e.entry_id for e in batch.entries]
    stored = {(bookie, e.entry_id) for bookie, batch in sent for e in batch.entries}
    assert len(stored) == sum(runs) * config.write_quorum


def test_the_bookies_of_a_write_set_share_one_frame() -> None:
    sent, _ = _sent(QuorumConfig(3, 3, 2), [5, 9])
    frames = [batch.to_frame() for _, batch in sent]
    assert len(frames) == 6 and frames[0] is frames[1] is frames[2] and frames[3] is frames[5]
    assert frames[0] != frames[3]
    for frame, (_, batch) in zip(frames, sent, strict=True):
        assert frame == length_prefix(len(batch.to_bytes())) + batch.to_bytes()
