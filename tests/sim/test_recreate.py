"""A stream deleted and created again under its name during a run (BUGGIFY `recreate`,
`stream.sim.incarnations`): the new incarnation gets a new id, its own writers and reader, and
is judged on its own: every property, and no entry of the deleted incarnation in what its
readers return, although the old writers may still run and the bookies may still hold the
old entries (until their trims or reconcilers drop them)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import pytest

from stream.metadata import paths
from stream.sim.buggify import Knobs
from stream.sim.checker import DURABILITY, Checker
from stream.sim.cluster import SimConfig, Simulation
from stream.sim.fault_space import FaultSpace
from stream.sim.incarnations import NO_RESURRECTION, IncarnationChecker, Origins
from stream.sim.runner import RandomWorkload, run_seed, run_simulation
from stream.sim.trace import Trace


@dataclass
class _Seen:
    recreated: int = 0
    # Recreations while a bookie still held an acknowledged entry of the deleted incarnation.
    over_old_entries: int = 0
    acked_by_new: int = 0
    read_by_new: int = 0


def _old_entries_held(sim: Simulation, name: str) -> bool:
    old = sim.streams[name]
    return any(
        bookie.held(old.id, entry_id) is not None
        for bookie in sim.bookies.values()
        for entry_id in old.checker.acked
    )


def _recreating_runs(seeds: range, seen: _Seen) -> None:
    for seed in seeds:

        async def script(sim: Simulation, seed: int = seed) -> None:
            workload = RandomWorkload(
                sim, random.Random(seed), knobs=Knobs(recreate=True, streams=True)
            )
            space = workload.space
            assert space is not None
            recreate = space._recreate  # noqa: SLF001 - counted as it happens

            def counted(name: str) -> None:
                before = sim.streams[name].id
                held = _old_entries_held(sim, name)
                recreate(name)
                if sim.streams[name].id != before:
                    seen.recreated += 1
                    seen.over_old_entries += held

            space._recreate = counted  # type: ignore[method-assign]  # noqa: SLF001
            await workload.run(60)
            await sim.finish()
            for stream in sim.streams.values():
                if isinstance(stream.checker, IncarnationChecker):
                    seen.acked_by_new += stream.checker.ack_count
                    seen.read_by_new += len(stream.checker.seen)

        result = run_simulation(seed, SimConfig(), script, steps=60, scenario="recreate")
        assert result.ok, f"seed {seed}: {result.violations}"


@pytest.mark.sweep  # 12 runs of 60 steps
def test_deleted_streams_are_created_again_under_their_writers_and_the_runs_pass() -> None:
    seen = _Seen()
    _recreating_runs(range(12), seen)
    assert seen.recreated >= 4, seen
    assert seen.over_old_entries >= 1, seen
    assert seen.acked_by_new >= 10, seen
    assert seen.read_by_new >= 10, seen


def test_the_recreate_knob_is_drawn_and_replays_identically() -> None:
    first = run_seed(5, 40, knobs={"recreate"})
    assert "recreate" in first.config
    assert first == run_seed(5, 40, knobs={"recreate"})


def test_a_stream_id_handed_out_again_resurrects_the_deleted_entries_and_is_caught() -> None:
    # Ids are never handed out twice (the `/streams/next-id` counter): with the counter set
    # back, the new incarnation takes the old one's id, and its reader is served the old
    # entries the bookies still hold.
    async def script(sim: Simulation) -> None:
        space = FaultSpace(sim, random.Random(1), Knobs(recreate=True), reengage=False)
        name = next(iter(space.writers))
        writer = space.writers[name][0]
        await sim.open_writer(writer)
        for _ in range(5):
            space.append_to(writer, 3)
            await asyncio.sleep(0.05)
        old = sim.streams[name]
        assert await sim.until(lambda: len(old.checker.acked) >= 10, 5.0)
        sim.admin.delete_stream(name)  # metadata only: the bookies keep the entries a while
        sim.zk.set(paths.STREAMS_NEXT_ID, str(old.id).encode(), -1)
        space._recreate(name)  # noqa: SLF001
        assert sim.streams[name].id == old.id
        opening = sim.client(space.writers[name][0]).opening
        assert opening is not None
        await asyncio.wait([opening], timeout=5.0)
        await sim.read(space.readers[name])

    result = run_simulation(2, SimConfig(), script, steps=0, scenario="reused-id")
    assert NO_RESURRECTION in {v.property for v in result.violations}, result.violations


def test_an_incarnation_checker_reports_entries_of_another_incarnation() -> None:
    origins = Origins()
    now = lambda: 0.0  # noqa: E731
    checker = IncarnationChecker(Trace(now), now, stream="s", origins=origins)
    origins.appended(Checker(Trace(now), now), [b"a#0", b"a#1"])  # the deleted incarnation
    origins.appended(checker, [b"b#0"])
    checker.on_read("r", 0, 1, [(0, b"b#0"), (1, b"x")])  # its own, and one of nobody's
    assert checker.violations == []
    checker.on_read("r", 2, 2, [(2, b"a#1")])
    assert [v.property for v in checker.violations] == [NO_RESURRECTION]
    checker.final(3, {0: b"b#0", 1: b"x", 2: b"a#1", 3: b"a#0"})
    assert [v.property for v in checker.violations] == [NO_RESURRECTION, NO_RESURRECTION]
    assert DURABILITY not in {v.property for v in checker.violations}
