"""Short chaos runs on real processes (three ZooKeeper servers, four bookies, two writers, two
readers, each in a network namespace of its own): with every protection on, the checker finds
nothing and the writers make progress once the faults heal; with the bookies' term check on
adds switched off (their test-only switch), it finds the superseded writer that goes on
writing.

A failing run prints its seed and schedule: `CHAOS_SEED=N` replays it here, and
`bench/chaos.py --seed N` runs it longer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stream.sandbox.chaos.nemesis import Step
from stream.sandbox.chaos.run import ChaosResult, run_chaos
from stream.sandbox.netns import unavailable_reason
from stream.sim.checker import SUPERSEDED_WRITER

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

_UNAVAILABLE = unavailable_reason()
if _UNAVAILABLE:
    pytest.skip(f"chaos tests need network namespaces: {_UNAVAILABLE}", allow_module_level=True)

SEED = int(os.environ.get("CHAOS_SEED", "20"))


def _report(result: ChaosResult) -> str:
    lines = [f"seed {result.seed} (replay: CHAOS_SEED={result.seed}): {result.verdict.summary()}"]
    lines += [result.delay_line()]
    lines += [f"  step: {step}" for step in result.steps]
    lines += [f"  {violation}" for violation in result.verdict.violations[:10]]
    return "\n".join(lines)


def test_a_short_chaos_run_breaks_no_property(tmp_path: Path) -> None:
    result = run_chaos(tmp_path, seed=SEED, duration_s=35.0, progress_bound_s=12.0)
    print(_report(result))
    assert result.steps, "the schedule applied no fault"
    assert result.verdict.ok, _report(result)
    assert result.verdict.acks > 0 and result.verdict.checked_entries > 0, _report(result)
    assert result.verdict.trims > 0, "the retention service trimmed nothing: " + _report(result)


def test_without_the_bookies_term_check_the_checker_finds_the_superseded_writer(
    tmp_path: Path,
) -> None:
    # The bookies start with the test-only switches: adds of a lower term are served, and
    # may replace entries at or below the LAC (else that second protection refuses the
    # superseded writer's adds: its ids are below the new term's LAC by the time it wakes).
    unsafe = ("add_term_check", "overwrite_check")
    # One pause, longer than the other writer's takeover (its retake waits 1-4 s).
    steps = [Step(3.0, "pause-writer", "writer-2", 9.5)]
    result = run_chaos(
        tmp_path, seed=SEED, duration_s=0, steps=steps, progress_bound_s=8.0, unsafe_skips=unsafe
    )
    print(_report(result))
    found = {violation.property for violation in result.verdict.violations}
    assert SUPERSEDED_WRITER in found, _report(result)
