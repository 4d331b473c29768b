"""Seeded runs replay identically, the random workload exercises the client, and `streamctl
sim` reports and exits as the issue asks."""

from __future__ import annotations

from dataclasses import fields

import pytest

from stream.cli.main import main
from stream.errors import InvalidArgumentError
from stream.sim.buggify import KNOBS, Knobs, check_knobs
from stream.sim.runner import run_many, run_seed
from stream.sim.scenarios import run_scenario


def test_same_seed_replays_identically() -> None:
    first, again = run_seed(11, 30), run_seed(11, 30)
    assert first == again  # digest, counts and violations
    assert first.trace_digest != run_seed(12, 30).trace_digest


def test_a_failing_seed_replays_identically() -> None:
    # Without fencing most random seeds fail: take the first that does.
    first = next(r for r in run_many(range(50), 40, {"term-fencing"}) if not r.ok)
    again = run_seed(first.seed, 40, {"term-fencing"})
    assert (again.trace_digest, again.violations) == (first.trace_digest, first.violations)
    scripted = run_scenario("zombie-writer", 3, {"term-fencing"})
    assert not scripted.ok and scripted == run_scenario("zombie-writer", 3, {"term-fencing"})


def test_random_runs_do_real_work() -> None:
    results = list(run_many(range(20), 40, stop_on_failure=False))
    assert sum(r.acknowledged for r in results) >= 200
    assert sum(r.faults for r in results) >= 100
    # A run that seals its stream early writes nothing after: a few are shorter.
    assert sum(r.events > 50 for r in results) >= 18


def test_worker_processes_give_the_same_results_in_order() -> None:
    alone = list(run_many(range(6), 20, stop_on_failure=False))
    pooled = list(run_many(range(6), 20, workers=2, stop_on_failure=False))
    assert [r.trace_digest for r in pooled] == [r.trace_digest for r in alone]


def test_cli_summary_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--seeds", "2", "--steps", "10"]) == 0
    out = capsys.readouterr().out
    assert "runs=2 steps=20" in out and "violations=0" in out
    code = main(["sim", "--seeds", "2", "--scenario", "zombie-writer", "--disable", "term-fencing"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAILED seed 0: superseded-writer" in out
    assert "replay: streamctl sim --seeds 1 --seed 0 --scenario zombie-writer" in out
    assert "runs=1 " in out  # stopped at the first failing seed
    with pytest.raises(SystemExit):
        main(["sim", "--disable", "no-such-protection"])
    assert main(["sim", "--list-scenarios"]) == 0
    assert "bp46-lost-entry" in capsys.readouterr().out


def test_buggify_knobs_are_drawn_from_the_seed_and_replay_identically() -> None:
    knobs = {"seal", "wipe", "zombie"}
    first = run_seed(7, 30, knobs=knobs)
    again = run_seed(7, 30, knobs=knobs)
    assert first == again
    assert "knobs=" in first.config and all(k in first.config for k in knobs)
    plain = run_seed(7, 30, buggify=False)
    assert plain.config.endswith("knobs=-")
    assert plain.trace_digest != first.trace_digest
    # Without forced knobs, the seed alone decides which are on.
    assert run_seed(7, 30).config == run_seed(7, 30).config


def test_knobs_are_checked() -> None:
    assert check_knobs(["seal"]) == {"seal"}
    assert set(KNOBS) == {f.name for f in fields(Knobs)}
    with pytest.raises(InvalidArgumentError, match="unknown knob"):
        run_seed(0, 5, knobs=["no-such-knob"])


def test_cli_replay_names_the_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sim", "--seeds", "20", "--disable", "term-fencing", "--knob", "zombie", "seal"]
    assert main([*args, "--no-buggify"]) == 1
    out = capsys.readouterr().out
    replay = next(line for line in out.splitlines() if "replay:" in line)
    assert "--no-buggify --knob seal zombie --disable term-fencing" in replay
    seed = int(replay.split("--seed ")[1].split()[0])
    # The printed command replays the same run.
    assert (
        main(
            [
                "sim",
                "--seeds",
                "1",
                "--seed",
                str(seed),
                "--no-buggify",
                "--knob",
                "seal",
                "zombie",
                "--disable",
                "term-fencing",
            ]
        )
        == 1
    )
    again = capsys.readouterr().out
    failed = next(line for line in out.splitlines() if line.startswith("FAILED"))
    assert failed in again.splitlines()
