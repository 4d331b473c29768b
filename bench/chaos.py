"""Chaos run on real processes: three ZooKeeper servers, bookies, writers and readers each in a
network namespace of its own, a seeded schedule of faults, and the history checker's verdict.

    python bench/chaos.py --minutes 30 --seed 7      # needs root (network namespaces)

The same seed replays the same schedule. Prints each step as it is applied, then the verdict,
the violations (if any) and each fault's effect on availability."""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

from stream.logs import configure_logging
from stream.sandbox.chaos.checker import Availability, Verdict
from stream.sandbox.chaos.nemesis import FAULTS
from stream.sandbox.chaos.run import run_chaos
from stream.sandbox.netns import unavailable_reason


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="faults for this long")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    parser.add_argument("--bookies", type=int, default=4)
    parser.add_argument("--progress-bound", type=float, default=30.0, help="seconds")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated subset")
    parser.add_argument(
        "--without-protection", action="append", default=[],
        help="switch a client protection off in the writers (to see the checker catch it)",
    )  # fmt: skip
    parser.add_argument(
        "--unsafe-add-term-check-off", action="store_true",
        help="the bookies serve adds of a lower term (test-only switch): the checker must object",
    )  # fmt: skip
    parser.add_argument("--keep", type=Path, default=None, help="keep data and history here")
    args = parser.parse_args()
    # Connection drops are the point of the exercise: only errors on stderr.
    configure_logging(level="error")
    reason = unavailable_reason()
    if reason:
        print(f"chaos: cannot run: {reason}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    print(f"chaos: seed {seed}, {args.minutes} minutes of faults (replay: --seed {seed})")
    with tempfile.TemporaryDirectory(prefix="streamkeeper-chaos-") as tmp:
        result = run_chaos(
            args.keep or Path(tmp),
            seed=seed,
            duration_s=args.minutes * 60,
            progress_bound_s=args.progress_bound,
            faults=tuple(f for f in args.faults.split(",") if f),
            without_protections=tuple(args.without_protection),
            on_step=lambda line: print(f"  {line}", flush=True),
            bookies=args.bookies,
            unsafe_skips=("add_term_check", "overwrite_check")
            if args.unsafe_add_term_check_off
            else (),
        )
    verdict = result.verdict
    print(f"chaos: seed {seed}, {result.duration_s:.0f}s: {verdict.summary()}")
    print(f"chaos: {result.delay_line()}")
    for violation in verdict.violations[:20]:
        print(f"  VIOLATION {violation}")
    print(
        "availability (s): fault -> first failed append | longest stall of acks | "
        "heal -> first acknowledged append"
    )
    for a in verdict.availability:
        fail = "-" if a.to_first_failure_s is None else f"{a.to_first_failure_s:6.2f}"
        ack = "-" if a.to_first_ack_after_heal_s is None else f"{a.to_first_ack_after_heal_s:6.2f}"
        print(f"  {a.fault:28} {fail:>8} | {a.longest_ack_gap_s:6.2f} | {ack:>8}")
    _print_by_kind(verdict)
    return 0 if verdict.ok else 1


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f}" if values else "     -"


def _print_by_kind(verdict: Verdict) -> None:
    """Per kind of fault: how many, how many failed an append, and the medians."""
    kinds: dict[str, list[Availability]] = {}
    for a in verdict.availability:
        kinds.setdefault(a.fault, []).append(a)
    print("by kind: count, with a failed append; medians: to failure | longest stall | heal to ack")
    for kind, items in sorted(kinds.items()):
        failures = [a.to_first_failure_s for a in items if a.to_first_failure_s is not None]
        stalls = [a.longest_ack_gap_s for a in items]
        acks = [
            a.to_first_ack_after_heal_s for a in items if a.to_first_ack_after_heal_s is not None
        ]
        print(
            f"  {kind:28} {len(items):3} {len(failures):3} {_median(failures)} | "
            f"{_median(stalls)} | {_median(acks)}"
        )


if __name__ == "__main__":
    sys.exit(main())
