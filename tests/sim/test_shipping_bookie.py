"""The simulator runs the shipping bookie: a rule broken inside `stream/bookie/` through a
test-only switch (`limbo_unknown`: a stream in limbo answers NO_SUCH_ENTRY for an entry it
lacks instead of UNKNOWN, so a recovery may take a lost acknowledged entry for one never
written) is found by random runs within 400 seeds, and the seeds searched are clean with the
switch off."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from stream.sim.cluster import Simulation
from stream.sim.runner import (
    DEFAULT_STEPS,
    RandomWorkload,
    RunResult,
    random_config,
    run_simulation,
)

SEARCH_SEEDS = 400
SWITCH = "limbo_unknown"


def _random_run(seed: int, bookie_switches: frozenset[str]) -> RunResult:
    """`run_seed`'s random run of `seed` (same config and workload), with the shipping
    bookie's own test-only switches on (`streamctl sim` names only the protections)."""
    master = random.Random(seed)
    config = random_config(random.Random(master.getrandbits(64)), frozenset())
    config = replace(config, disabled=bookie_switches)
    workload_seed = master.getrandbits(64)

    async def script(sim: Simulation) -> None:
        await RandomWorkload(sim, random.Random(workload_seed)).run(DEFAULT_STEPS)
        await sim.finish()

    return run_simulation(seed, config, script, steps=DEFAULT_STEPS, scenario="random")


@pytest.mark.timeout(900)
def test_random_runs_find_a_rule_broken_inside_the_bookie() -> None:
    found = None
    for seed in range(SEARCH_SEEDS):
        result = _random_run(seed, frozenset({SWITCH}))
        if not result.ok:
            found = result
            break
    assert found is not None, f"{SWITCH}: nothing found in {SEARCH_SEEDS} seeds"
    print(f"\n{SWITCH}: seed {found.seed}: {found.violations[0]}")
    for seed in range(found.seed + 1):
        clean = _random_run(seed, frozenset())
        assert clean.ok, f"seed {seed} fails with the switch off: {clean.violations[0]}"
