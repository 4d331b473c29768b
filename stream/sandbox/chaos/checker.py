"""The checker of a chaos run: the safety properties of docs/design.md §10 and progress, over the
recorded history (stream.sandbox.chaos.history), Jepsen's way: only what the processes saw.

- `durability`: an entry id acknowledged with two payloads; a read of an acknowledged id that
  returns other bytes; an acknowledged entry at or above the final first retained entry that the
  final read (after the seal) does not return with its payload.
- `no-divergence` / `reader-agreement`: every read of one id returns the same payload, and a
  reader segment (a stretch read without a gap) covering an id holds it exactly when every other
  segment covering it does (no-ops are skipped by all).
- `superseded-writer`: an acknowledgment of entry e to a writer of term t after a newer term T's
  recovery fixed the end (its takeover returned, or the metadata showed it) with e >= T's first
  entry id.
- `progress`: after a heal followed by at least `progress_bound_s` without faults, some append
  was acknowledged within `progress_bound_s` of the heal.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stream.sandbox.chaos.history import ACK, FAIL, FAULT, HEAL, OPEN, READ, TERM_FIXED, TRIM
from stream.sim.checker import (
    DURABILITY,
    NO_DIVERGENCE,
    PROGRESS,
    READER_AGREEMENT,
    SUPERSEDED_WRITER,
    Violation,
)

Event = dict[str, Any]
# The process name of the harness's last read, after the seal.
FINAL_READER = "final"
FINAL = "final-range"  # event: the final read covered first..last


# Append failures that are no fault's doing: a takeover by the other writer (all the time), and
# the appends in flight that a writer aborts when it stops (after such a takeover).
_NOT_FAULTS = ("InvalidTermError", "WriterClosedError")


@dataclass(frozen=True)
class Availability:
    """One fault's effect: seconds from the fault to the first append failed while it held
    (for another reason than a takeover by the other writer), from its heal to the first
    acknowledged append (None: none happened), and the longest stall of acknowledgments."""

    fault: str
    to_first_failure_s: float | None
    to_first_ack_after_heal_s: float | None
    # The longest stretch without an acknowledgment from the fault to the first one after its
    # heal: how long writing stalled (appends mostly wait rather than fail).
    longest_ack_gap_s: float = 0.0


@dataclass
class Verdict:
    violations: list[Violation] = field(default_factory=list)
    acks: int = 0
    appends: int = 0
    reads: int = 0
    checked_entries: int = 0
    read_back: int = 0
    trims: int = 0  # the first retained entry moved (the retention service's work)
    faults: dict[str, int] = field(default_factory=dict)
    availability: list[Availability] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        state = "OK" if self.ok else f"{len(self.violations)} VIOLATION(S)"
        return (
            f"{state}: {self.appends} appends, {self.acks} acknowledged, {self.reads} reads, "
            f"{self.read_back} acknowledged entries read back by readers, "
            f"{self.checked_entries} checked by the final read, {self.trims} trims, faults "
            + (", ".join(f"{k}={v}" for k, v in sorted(self.faults.items())) or "none")
        )


def _violate(verdict: Verdict, prop: str, time_s: float, details: str) -> None:
    verdict.violations.append(Violation(prop, time_s, details))


def _check_acks(events: Sequence[Event], verdict: Verdict) -> dict[int, Event]:
    """Durability (one id, two payloads) and superseded writers; returns the first ack of each
    entry id."""
    fixed: dict[int, tuple[int | None, float]] = {}
    for event in events:
        if event["type"] == TERM_FIXED:
            first, at = fixed.get(event["term"], (None, event["t"]))
            fixed[event["term"]] = (event["first"], min(at, event["t"]))
        elif event["type"] == OPEN:
            first, at = fixed.get(event["term"], (None, event["t"]))
            fixed[event["term"]] = (first, min(at, event["t"]))
    acked: dict[int, Event] = {}
    for event in events:
        if event["type"] != ACK:
            continue
        verdict.acks += 1
        entry_id, term = event["e"], event["term"]
        for newer, (first, at) in fixed.items():
            if newer > term and first is not None and entry_id >= first and at < event["t"]:
                _violate(
                    verdict,
                    SUPERSEDED_WRITER,
                    event["t"],
                    f"{event['p']} (term {term}) got entry {entry_id} acknowledged after term "
                    f"{newer}'s recovery fixed the end (its first entry {first})",
                )
                break
        previous = acked.setdefault(entry_id, event)
        if previous["v"] != event["v"]:
            _violate(
                verdict,
                DURABILITY,
                event["t"],
                f"entry {entry_id} acknowledged as {previous['v']!r} ({previous['p']}) and "
                f"as {event['v']!r} ({event['p']})",
            )
    return acked


def _check_reads(events: Sequence[Event], acked: dict[int, Event], verdict: Verdict) -> None:
    """Every read of an id agrees with the others and with its acknowledgment; every segment
    covering an id holds it exactly when the others do."""
    seen: dict[int, Event] = {}
    segments: dict[tuple[str, int], dict[int, str]] = defaultdict(dict)
    for event in events:
        if event["type"] != READ:
            continue
        verdict.reads += 1
        entry_id = event["e"]
        segments[(event["p"], event["seg"])][entry_id] = event["v"]
        ack = acked.get(entry_id)
        if ack is not None and ack["v"] == event["v"] and entry_id not in seen:
            verdict.read_back += 1
        if ack is not None and ack["v"] != event["v"]:
            _violate(
                verdict,
                DURABILITY,
                event["t"],
                f"{event['p']} read entry {entry_id} as {event['v']!r}, acknowledged as "
                f"{ack['v']!r}",
            )
        first = seen.setdefault(entry_id, event)
        if first["v"] != event["v"]:
            _violate(
                verdict,
                NO_DIVERGENCE,
                event["t"],
                f"entry {entry_id} read as {first['v']!r} by {first['p']} and as "
                f"{event['v']!r} by {event['p']}",
            )
    covered = {key: (min(ids), max(ids)) for key, ids in segments.items() if ids}
    for entry_id in sorted(seen):
        holders = [key for key, (lo, hi) in covered.items() if lo <= entry_id <= hi]
        missing = [key for key in holders if entry_id not in segments[key]]
        if missing and len(missing) < len(holders):
            who = ", ".join(f"{p}#{seg}" for p, seg in missing)
            _violate(
                verdict,
                READER_AGREEMENT,
                seen[entry_id]["t"],
                f"entry {entry_id} ({seen[entry_id]['v']!r}) skipped by {who} and read by others",
            )


def _check_final(events: Sequence[Event], acked: dict[int, Event], verdict: Verdict) -> None:
    ranges = [event for event in events if event["type"] == FINAL]
    if not ranges:
        return
    final = ranges[-1]
    read = {e["e"]: e["v"] for e in events if e["type"] == READ and e["p"] == FINAL_READER}
    for entry_id, ack in sorted(acked.items()):
        if entry_id < final["first"]:
            continue  # trimmed by retention
        verdict.checked_entries += 1
        if read.get(entry_id) != ack["v"]:
            found = read.get(entry_id, "nothing")
            _violate(
                verdict,
                DURABILITY,
                final["t"],
                f"acknowledged entry {entry_id} ({ack['v']!r}, {ack['p']}) lost: the final "
                f"read of {final['first']}..{final['last']} returned {found!r}",
            )


def _longest_gap(times: Sequence[float], start: float, stop: float) -> float:
    points = [start, *(t for t in times if start < t < stop), stop]
    return max(b - a for a, b in itertools.pairwise(points))


def _check_progress(events: Sequence[Event], bound_s: float, verdict: Verdict) -> None:
    """Each fault's availability; progress after each heal followed by a quiet `bound_s`."""
    faults = [e for e in events if e["type"] in (FAULT, HEAL)]
    acks = [e["t"] for e in events if e["type"] == ACK]
    fails = [e["t"] for e in events if e["type"] == FAIL and e.get("error") not in _NOT_FAULTS]
    end = max((e["t"] for e in events), default=0.0)
    for i, event in enumerate(faults):
        if event["type"] != FAULT:
            continue
        verdict.faults[event["name"]] = verdict.faults.get(event["name"], 0) + 1
        heal = next((e for e in faults[i + 1 :] if e["type"] == HEAL), None)
        healed_at = heal["t"] if heal else end
        next_fault = next((e["t"] for e in faults[i + 1 :] if e["type"] == FAULT), end)
        failed = next((t for t in fails if event["t"] <= t <= healed_at), None)
        resumed = next((t for t in acks if t >= healed_at), None)
        verdict.availability.append(
            Availability(
                event["name"],
                None if failed is None else failed - event["t"],
                None if resumed is None else resumed - healed_at,
                _longest_gap(acks, event["t"], resumed if resumed is not None else end),
            )
        )
        quiet = next_fault - healed_at >= bound_s
        if heal is not None and quiet and (resumed is None or resumed - healed_at > bound_s):
            _violate(
                verdict,
                PROGRESS,
                healed_at,
                f"no append acknowledged within {bound_s}s of healing {event['name']}",
            )


def check(events: Sequence[Event], *, progress_bound_s: float = 30.0) -> Verdict:
    """Returns the verdict over a whole history (events ordered by time)."""
    verdict = Verdict()
    verdict.appends = sum(1 for event in events if event["type"] == "invoke")
    verdict.trims = sum(1 for event in events if event["type"] == TRIM)
    acked = _check_acks(events, verdict)
    _check_reads(events, acked, verdict)
    _check_final(events, acked, verdict)
    _check_progress(events, progress_bound_s, verdict)
    return verdict
