"""`streamctl sim`: the deterministic simulator (docs/design.md §10). Runs seeded simulations of the
real client against simulated bookies, network and ZooKeeper, with random faults (or a directed
scenario), prints a summary, and exits 1 with the first failing seed and the violated property
when the checker finds one. A seed replays identically: `--seeds 1 --seed S` reruns it."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from rich.console import Console

from stream.sim.buggify import KNOBS
from stream.sim.checker import PROPERTIES
from stream.sim.cluster import PROTECTIONS
from stream.sim.runner import DEFAULT_STEPS, RunResult, run_many, sim_logging


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "sim",
        description="Runs N seeded simulations (random faults: lost, delayed, duplicated and "
        "reordered messages, swizzle-clog, bookie crashes and disk wipes, read-only and full "
        "disks, paused and competing writers, seals, faults on readers' links, metadata "
        "session loss; BUGGIFY knobs drawn per seed bias them toward rare shapes) of the real "
        "client, checks the safety properties, and exits 1 on the first violation, printing "
        "its seed and the command that replays it.",
    )
    p.add_argument("--seeds", type=int, default=100, help="number of seeds to run (default 100)")
    p.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    p.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"random steps per run (default {DEFAULT_STEPS})",
    )
    p.add_argument(
        "--disable",
        nargs="+",
        action="extend",
        default=[],
        choices=PROTECTIONS,
        metavar="PROTECTION",
        help=f"switch protections off: {', '.join(PROTECTIONS)}",
    )
    p.add_argument(
        "--scenario",
        default=None,
        help="run a directed fault schedule instead of random faults (see --list-scenarios)",
    )
    p.add_argument(
        "--list-scenarios", action="store_true", help="list the directed scenarios and exit"
    )
    p.add_argument(
        "--workers", type=int, default=1, help="worker processes (default 1; results in order)"
    )
    p.add_argument("--keep-going", action="store_true", help="run every seed even after a failure")
    p.add_argument(
        "--reengage",
        action="store_true",
        help="random runs whose writers take over again when superseded (reengage=True)",
    )
    p.add_argument(
        "--no-buggify",
        dest="buggify",
        action="store_false",
        help="random runs without BUGGIFY: every fault knob off (the plain random workload)",
    )
    p.add_argument(
        "--knob",
        dest="knobs",
        nargs="+",
        action="extend",
        default=[],
        choices=KNOBS,
        metavar="KNOB",
        help=f"switch fault knobs on in every random run (others drawn per seed): "
        f"{', '.join(KNOBS)}",
    )
    p.add_argument(
        "--knob-off",
        dest="knobs_off",
        nargs="+",
        action="extend",
        default=[],
        choices=KNOBS,
        metavar="KNOB",
        help="switch fault knobs off in every random run, whatever the draw (a seed found "
        "before a knob existed replays with it off)",
    )
    p.add_argument(
        "--trace", action="store_true", help="print the last trace events of a failing seed"
    )
    p.set_defaults(handler=run)


def _list_scenarios(out: Console) -> int:
    from stream.sim.scenarios import SCENARIOS

    for scenario in SCENARIOS.values():
        target = scenario.targets or "(all protections on)"
        out.print(f"[bold]{scenario.name}[/]  {target}: {scenario.summary}")
    return 0


def _results(args: argparse.Namespace) -> Any:
    seeds = range(args.seed, args.seed + args.seeds)
    if args.scenario is None:
        return run_many(
            seeds,
            args.steps,
            args.disable,
            workers=args.workers,
            stop_on_failure=not args.keep_going,
            reengage=args.reengage,
            buggify=args.buggify,
            knobs=args.knobs,
            knobs_off=args.knobs_off,
        )
    from stream.sim.scenarios import run_scenario

    def scenario_results() -> Any:
        for seed in seeds:
            result = run_scenario(args.scenario, seed, args.disable)
            yield result
            if not result.ok and not args.keep_going:
                return

    return scenario_results()


def run(args: argparse.Namespace) -> int:
    out = Console(file=sys.stdout, highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if args.list_scenarios:
        return _list_scenarios(out)
    if args.scenario is not None:
        from stream.sim.scenarios import SCENARIOS

        if args.scenario not in SCENARIOS:
            err.print(f"streamctl sim: unknown scenario {args.scenario!r} (see --list-scenarios)")
            return 2
    if args.seeds < 1 or args.steps < 1 or args.workers < 1:
        err.print("streamctl sim: --seeds, --steps and --workers must be >= 1")
        return 2
    level = getattr(logging, str(args.log_level).upper(), logging.WARNING)
    sim_logging(show=level < logging.WARNING, level=level)
    started = time.monotonic()
    runs = steps = faults = acknowledged = 0
    failures: list[RunResult] = []
    for result in _results(args):
        runs += 1
        steps += result.steps
        faults += result.faults
        acknowledged += result.acknowledged
        if not result.ok:
            failures.append(result)
            _report_failure(out, result, args)
        elif err.is_terminal and runs % 50 == 0:
            err.print(f"{runs}/{args.seeds} seeds passed", end="\r")
    elapsed = time.monotonic() - started
    violations = sum(len(r.violations) for r in failures)
    out.print(
        f"runs={runs} steps={steps} faults={faults} acknowledged={acknowledged} "
        f"violations={violations} failing_seeds={len(failures)} "
        f"disabled={','.join(sorted(args.disable)) or '-'} "
        f"scenario={args.scenario or 'random'} time={elapsed:.1f}s"
    )
    return 1 if failures else 0


def _report_failure(out: Console, result: RunResult, args: argparse.Namespace) -> None:
    # A safety property first: a liveness failure is often its consequence.
    ordered = sorted(result.violations, key=lambda v: v.property not in PROPERTIES)
    first = ordered[0]
    out.print(
        f"[red]FAILED[/] seed {result.seed}: {first.property} violated at "
        f"t={first.time_s:.4f}s: {first.details}",
        markup=True,
    )
    for other in ordered[1:6]:
        out.print(f"  also {other}")
    out.print(f"  cluster: {result.config}")
    replay = f"streamctl sim --seeds 1 --seed {result.seed}"
    if args.scenario:
        replay += f" --scenario {args.scenario}"
    else:
        replay += f" --steps {args.steps}"
        if args.reengage:
            replay += " --reengage"
        if not args.buggify:
            replay += " --no-buggify"
        if args.knobs:
            replay += " --knob " + " ".join(sorted(set(args.knobs)))
        if args.knobs_off:
            replay += " --knob-off " + " ".join(sorted(set(args.knobs_off)))
    if args.disable:
        replay += " --disable " + " ".join(sorted(set(args.disable)))
    out.print(f"  replay: {replay} --trace")
    if args.trace:
        for line in result.trace_tail:
            out.print(f"    {line}", markup=False)
