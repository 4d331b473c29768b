"""The bookie's storage jobs in the simulation: journal syncs take virtual time (groups form,
appends are acknowledged after their sync), random crashes land in the middle of a job and
replay recovers what was acknowledged, acknowledging before the journal sync is caught by
random runs, and the bookie's reconciler trims what metadata no longer retains."""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import replace

import pytest

from stream.bookie.reconcile import TRIM_ALL
from stream.framing.prepare import prepare_entry
from stream.protocol import EntryFlag
from stream.sim.acknowledged import BOOKIE_DURABILITY, AnsweredAdds
from stream.sim.bookie import SimBookie
from stream.sim.buggify import Knobs
from stream.sim.cluster import STREAM_NAME, SimConfig, Simulation
from stream.sim.loop import run_simulated
from stream.sim.runner import RandomWorkload, RunResult, random_config, run_many, run_simulation
from stream.sim.trace import Trace
from stream.wire import bookie_pb2 as pb

S = 7
SEARCH_SEEDS = 400
SWITCH = "journal_sync"


def _add_request(entry_id: int, flags: int = 0) -> pb.AddRequest:
    request = pb.AddRequest(stream_id=S, term=1, lac=-1, lafr=-1)
    request.entries.append(prepare_entry(S, entry_id, flags, 1000, b"x").entry())
    return request


def test_journal_syncs_take_virtual_time_and_group_the_adds_meanwhile() -> None:
    async def body() -> tuple[float, int]:
        loop = asyncio.get_running_loop()
        bookie = SimBookie("b1", trace=Trace(loop.time), journal_sync_s=0.004)
        syncs = 0
        fdatasync = bookie.disk.fdatasync

        def counted(fd: int) -> None:
            nonlocal syncs
            syncs += 1
            fdatasync(fd)

        bookie.disk.fdatasync = counted  # type: ignore[method-assign]
        start = loop.time()
        pending = []
        for entry_id in range(10):  # one add every 0.5 ms: ten within a few syncs
            pending.append(bookie.add(_add_request(entry_id)))
            await asyncio.sleep(0.0005)
        first = await pending[0]
        first_answered_s = loop.time() - start
        responses = [first, *await asyncio.gather(*pending[1:])]
        assert all(list(r.codes) == [pb.OK] for r in responses)
        return first_answered_s, syncs

    first_answered_s, syncs = run_simulated(body())
    # The first add waits out a whole sync (at least half the typical one), and the nine
    # that arrive meanwhile share a few group commits instead of nine.
    assert first_answered_s >= 0.002, first_answered_s
    assert syncs <= 4, syncs


def _torn_run(seed: int) -> tuple[RunResult, Simulation]:
    """Runs the random workload of `seed` with mid-job crashes on and slow journal syncs."""
    holder: list[Simulation] = []
    rng = random.Random(seed)
    config = replace(random_config(rng, frozenset()), journal_sync_s=0.004)

    async def script(sim: Simulation) -> None:
        holder.append(sim)
        workload = RandomWorkload(
            sim, random.Random(rng.getrandbits(64)), knobs=Knobs(torn_jobs=True)
        )
        await workload.run(40)
        await sim.finish()

    result = run_simulation(seed, config, script, steps=40, scenario="torn-jobs")
    return result, holder[0]


def test_random_crashes_land_in_the_middle_of_jobs_and_replay_recovers() -> None:
    power_cuts = unsynced = reconciled = 0
    for seed in range(12):
        result, sim = _torn_run(seed)
        # The checker's properties and the per-bookie oracle (nothing a journaled bookie
        # acknowledged is missing after its restart) hold on every seed.
        assert result.ok, (seed, result.violations)
        bookies = sim.bookies.values()
        power_cuts += sum(b.power_cuts for b in bookies)
        unsynced += sum(b.disk.unsynced_at_crash for b in bookies)
        reconciled += sum(b.reconcile_rounds for b in bookies)
    # Crashes did stop jobs at a sync, with written bytes not yet synced (the torn tails and
    # unsynced files replay meets), and the reconcilers ran their rounds.
    assert power_cuts >= 5, power_cuts
    assert unsynced >= 5, unsynced
    assert reconciled > 0


@pytest.mark.timeout(900)
def test_acknowledging_before_the_journal_sync_is_caught_by_random_runs() -> None:
    workers = min(2, os.cpu_count() or 1)
    results = run_many(range(SEARCH_SEEDS), bookie_switches={SWITCH}, workers=workers)
    found = next((r for r in results if not r.ok), None)
    assert found is not None, f"{SWITCH}: nothing found in {SEARCH_SEEDS} seeds"
    print(f"\n{SWITCH}: seed {found.seed}: {found.violations[0]}")
    assert BOOKIE_DURABILITY in {v.property for v in found.violations}
    clean = run_many(range(found.seed + 1), workers=workers)
    failed = next((r for r in clean if not r.ok), None)
    assert failed is None, f"seed {failed.seed} fails with the switch off: {failed.violations[0]}"


def test_answered_adds_forget_what_the_bookie_was_told_to_drop() -> None:
    answered = AnsweredAdds()
    for entry_id in range(6):
        request = _add_request(entry_id)
        answered.on_add(request, [pb.OK], answered.add_arrived(request))
    request = _add_request(6)
    answered.on_add(request, [pb.INVALID_TERM], answered.add_arrived(request))  # no promise
    late = _add_request(7)
    late_arrival = answered.add_arrived(late)
    answered.truncate_arrived(S, 4)  # 5 may go, and 7 that arrived before it
    answered.on_add(late, [pb.OK], late_arrival)
    # 0 was trimmed away (below the first retained entry): only 1 is missing.
    assert answered.missing(lambda _: 1, lambda _, e: e in {0, 2, 3, 4}) == [(S, 1)]
    noop = _add_request(3, flags=int(EntryFlag.TRUNCATE))  # 4 may go, unanswered or not
    answered.add_arrived(noop)
    assert answered.missing(lambda _: 1, lambda _, e: e in {0, 2, 3}) == [(S, 1)]
    answered.forget()
    assert answered.missing(lambda _: 0, lambda _, e: False) == []


def test_a_stream_deleted_from_metadata_is_trimmed_by_the_bookies_reconcilers() -> None:
    config = SimConfig(bookies=3, ensemble=3, write_quorum=3, ack_quorum=2)
    holder: list[Simulation] = []

    async def script(sim: Simulation) -> None:
        holder.append(sim)
        writer = await sim.open_writer("c1")
        assert writer is not None
        sim.append("c1", 5)
        assert await sim.until(lambda: len(sim.checker.acked) == 5, timeout_s=2.0)
        await writer.close()
        sim.admin.delete_stream(STREAM_NAME)
        # No Trim is sent: only each bookie's reconciler, reading metadata every GC
        # interval, lets the data go.
        await asyncio.sleep(2.0)

    run_simulation(0, config, script, steps=0, scenario="reconcile")
    sim = holder[0]
    for bookie in sim.bookies.values():
        state = bookie.streams.get(sim.stream_id)
        assert state is not None and state.first_entry_id == TRIM_ALL, bookie.bookie_id
        assert bookie.held(sim.stream_id, 0) is None
