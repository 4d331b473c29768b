"""Why a reader's known LAC is taken only when it opens (`open_reader(..., known_lac=)`), on
the real reader in the simulator: a reader opened before a takeover holds a snapshot whose
last fragment is still open on the old ensemble. A recovery that missed one of its bookies
ends the stream before the entries that bookie alone holds (a writer's adds that reached
only it), and the next writer's entries under those ids live in a new fragment. Trusting the
old snapshot up to an LAC read since, as `read(..., known_lac=)` did, reads the bookie's
never committed entries. A read that rereads the metadata first, or asks the bookies of its
snapshot's last fragment for the LAC, cannot: either tells it where those entries are not (the
old fragment's bookies report the LAC of the writer that left it). The known LAC skips both,
so it is taken only before the snapshot is read."""

from __future__ import annotations

import pytest

from stream.errors import StreamError
from stream.sim.checker import NO_DIVERGENCE
from stream.sim.cluster import Simulation
from stream.sim.runner import RunResult, run_simulation
from stream.sim.scenarios import _config, _dirty_tail


def _run(seed: int, *, trust_old_snapshot: bool) -> tuple[RunResult, list[int]]:
    read: list[int] = []

    async def script(sim: Simulation) -> None:
        sim.set_read_only("b4", True)  # C1's ensemble is B1, B2, B3
        good = await _dirty_tail(sim, 2)  # C1's next two entries reach B1 only; C1 hangs
        if good < 0:
            return
        reader = sim.reader("r1")
        await reader.open()  # its snapshot: one fragment, open, on B1-B3
        sim.set_read_only("b4", False)
        sim.network.cut("c2", "b1")  # C2's recovery misses B1: the stream ends at `good`
        writer = await sim.open_writer("c2")
        if writer is None:
            return
        first = writer.last_add_confirmed + 1
        sim.append("c2", 2)
        await sim.until(lambda: sim.acked(first + 1))
        for bookie_id in ("b2", "b3", "b4"):
            sim.network.cut("r1", bookie_id)  # the reader reaches B1 only
        if trust_old_snapshot:
            reader._known_lac = first + 1  # as read(first, first + 1, known_lac=first + 1) did
        got = []
        try:
            async for batch in reader.read(first, first + 1):
                got.extend((e.entry_id, e.payload) for e in batch)
        except StreamError:
            pass  # nothing to read from where the entries are: the read fails
        read.extend(entry_id for entry_id, _ in got)
        if got:
            sim.checker.on_read("r1", first, got[-1][0], got)
        await sim.finish()

    return run_simulation(seed, _config(), script, steps=0, scenario="stale-reader"), read


@pytest.mark.parametrize("seed", range(3))
def test_an_old_snapshot_trusted_up_to_a_later_lac_reads_never_committed_entries(
    seed: int,
) -> None:
    result, read = _run(seed, trust_old_snapshot=True)
    assert read, "the reader read nothing"
    assert NO_DIVERGENCE in {v.property for v in result.violations}, result.violations


@pytest.mark.parametrize("seed", range(3))
def test_a_read_that_rereads_the_metadata_and_the_lac_never_does(seed: int) -> None:
    result, read = _run(seed, trust_old_snapshot=False)
    assert result.ok, result.violations
    assert read == []  # the entries live on bookies it cannot reach
