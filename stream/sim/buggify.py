"""FoundationDB's BUGGIFY for the random runs: each run switches on a random few fault knobs,
drawn from its seed, and the knobs it has push the random choices toward the rare shapes the
protections guard (a fence that misses the bookie with the longest log, a writer frozen right
after its takeover, a disk wiped just after a new term began...). A run with few knobs
concentrates on a few shapes instead of spreading thin over all of them, which is what lets
400 random seeds reach each protection's counterexample.

Nothing here acts: `Knobs` only says which faults a run may draw and how often.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, fields

from stream.errors import InvalidArgumentError
from stream.sim.cluster import (
    NEW_MEMBER_TRUNCATION,
    PHASE_ONE_FENCE,
    SPARE_HOLDERS,
    TRUNCATE_NOOP,
    UNPINNED_FIRST,
)


@dataclass(frozen=True, slots=True)
class Knobs:
    """The fault knobs of one run (each on or off).

    - `hold_adds`: a writer's Add stream to a bookie is held for a while (its unary requests
      still pass): dirty tails on a subset of the write set, recovery write-backs that miss.
    - `isolate`: a takeover (or seal) starts cut from one bookie, most often the one holding
      the longest log: its fence and reads miss the dirty data.
    - `favor`: a takeover's reads are answered by one bookie first (the longest log).
    - `zombie`: a writer freezes right after its takeover, before it writes, and a competitor
      takes over meanwhile: the old writer wakes up with no connection yet.
    - `wipe`: a bookie loses its disk right after a takeover (within the loss budget).
    - `placement`: bookies turn read-only and writable again: placement goes where dirty
      data is, and dropped members come back.
    - `seal`: the stream is sealed once during the writes.
    - `outage`: more than two bookies may be down at once.
    - `reader_faults`: readers' links are cut and clogged too.
    - `disk_faults`: bookies' disks turn read-only or full for a while.
    - `slow_bookie`: one bookie (most often the longest log) answers writers late for a while.
    - `streams`: several streams, each with its competing writers and a reader
      (`stream.sim.fault_space`).
    - `trim`: streams are trimmed explicitly (the Python API's `trim`) during the writes.
    - `delete`: other streams are deleted during their writes (most often under a live
      writer).
    - `too_busy`: bookies' write caches are tiny: adds are answered TOO_BUSY while full.
    - `services`: the auditor, replication workers and scrub run, racing the writers.
    - `retention`: the retention service runs with a random policy on every stream.
    - `dirty_tail`: a writer dies right after a batch that reached one bookie only, and
      another takes over missing that bookie (`stream.sim.shapes`).
    - `spare_churn`: a takeover's write-backs to one member are held, and the bookie that
      replaces it fails right after it joined (`stream.sim.shapes`).
    - `torn_jobs`: bookies crash in the middle of their storage jobs (a power cut at a sync of
      a journal group commit, a flush or GC): replay meets torn tails and unsynced files.
      Journaled bookies only (they promise to lose nothing they acknowledged).
    - `torn_journal_less`: the same power cuts on journal-less bookies, within the loss
      budget: they may lose what they had not flushed, never a term they served
      (`stream.sim.answered_terms`).
    - `recreate`: a deleted stream is created again under its name while the old one's
      writers, readers and bookie entries may still be around (`stream.sim.incarnations`).
    - `pinned_pair`: two members of a writer's ensemble fail, the first in ensemble order
      pinned, the other not (`stream.sim.shapes`).
    """

    hold_adds: bool = False
    isolate: bool = False
    favor: bool = False
    zombie: bool = False
    wipe: bool = False
    placement: bool = False
    seal: bool = False
    outage: bool = False
    reader_faults: bool = False
    disk_faults: bool = False
    slow_bookie: bool = False
    streams: bool = False
    trim: bool = False
    delete: bool = False
    too_busy: bool = False
    services: bool = False
    retention: bool = False
    dirty_tail: bool = False
    spare_churn: bool = False
    # The storage jobs' knobs.
    torn_jobs: bool = False
    torn_journal_less: bool = False
    recreate: bool = False
    pinned_pair: bool = False

    def names(self) -> list[str]:
        """Returns the names of the knobs that are on (for the trace and reports)."""
        return [f.name for f in fields(self) if getattr(self, f.name)]


# How often each knob is on in a run: rare enough that most runs stay near the plain random
# workload, common enough that their combinations come up within a few hundred seeds.
_ODDS = {
    "hold_adds": 0.4,
    "isolate": 0.4,
    "favor": 0.4,
    "zombie": 0.5,
    "wipe": 0.4,
    "placement": 0.3,
    "seal": 0.25,
    "outage": 0.2,
    "reader_faults": 0.3,
    "disk_faults": 0.2,
    "slow_bookie": 0.4,
    # Drawn after the others (in this order), so that adding them changed no earlier draw.
    "streams": 0.3,
    "trim": 0.3,
    "delete": 0.3,
    "too_busy": 0.2,
    "services": 0.25,
    "retention": 0.2,
    "dirty_tail": 0.3,
    "spare_churn": 0.3,
    # The storage jobs' knobs.
    "torn_jobs": 0.5,
    # Drawn last (in this order): a run with them off is the run it was before they existed.
    "torn_journal_less": 0.3,
    "recreate": 0.2,
    "pinned_pair": 0.2,
}


def draw_knobs(rng: random.Random) -> Knobs:
    """Returns the knobs of one run, drawn from `rng` (in a fixed order)."""
    return Knobs(**{name: rng.random() < odds for name, odds in _ODDS.items()})


KNOBS = tuple(_ODDS)
# The knobs of issue 15's fault space (`stream.sim.fault_space`): a seed found before they
# existed replays its old run with them off (`run_seed(..., knobs_off=...)`).
FAULT_SPACE_KNOBS = frozenset(
    {"streams", "trim", "delete", "too_busy", "services", "retention", "recreate"}
)
# The knobs of `stream.sim.shapes`, added after the regression seeds of the late Truncate were
# found (drawn last: a run with them off is the run it was before they existed).
SHAPE_KNOBS = frozenset({"dirty_tail", "spare_churn", "pinned_pair"})
# Knobs added after the regression seeds and every search's first failing seed were
# measured: a seed found before them replays with them off (`knobs_off`), and a search (a
# protection or a bookie switch off) leaves them off unless it guards them
# (`GUARDED_SHAPES`) or names them, so that the others' searches stay the runs they were;
# drawn as any knob with everything on.
LATE_KNOBS = frozenset({"torn_journal_less", "recreate", "pinned_pair"})

# The knobs a run switches on whatever its draw while a protection is off: the shapes that
# protection's directed scenario (`stream.sim.scenarios`) shows it guards, so that a search
# with it off spends its seeds there. Protections absent here are reached by the drawn
# knobs alone within 400 seeds.
GUARDED_SHAPES: dict[str, frozenset[str]] = {
    # blog-divergence: a dirty tail on one bookie, a takeover whose fence misses it.
    TRUNCATE_NOOP: frozenset({"dirty_tail"}),
    # design-new-member: a dirty tail, and placement moving back onto the bookie holding it.
    NEW_MEMBER_TRUNCATION: frozenset({"dirty_tail"}),
    # bp46-lost-fence: a writer frozen right after its takeover, before its first add.
    PHASE_ONE_FENCE: frozenset({"zombie"}),
    # replaced-member-returns: write-backs held, the replacement failing, placement moving.
    SPARE_HOLDERS: frozenset({"spare_churn"}),
    # pinned-first: a member held (it acks committed entries late) while another fails.
    UNPINNED_FIRST: frozenset({"pinned_pair"}),
}

# The bookie's own test-only switches (`stream.bookie.unsafe`), for the tests that break a rule
# inside it: acknowledging before the journal sync loses data only when a crash lands in the
# middle of the group commit; a limbo bookie's explicit negative matters only after a lost disk
# (limbo), for an entry that reached a subset of its write set (held adds).
GUARDED_SHAPES.update(
    {
        "journal_sync": frozenset({"torn_jobs"}),
        "limbo_unknown": frozenset({"wipe", "hold_adds"}),
    }
)


def guarded_shapes(disabled: Iterable[str]) -> frozenset[str]:
    """Returns the knobs to switch on in every run while the protections in `disabled` are
    off (`GUARDED_SHAPES`)."""
    return frozenset().union(*(GUARDED_SHAPES.get(name, frozenset()) for name in disabled))


def check_knobs(names: Iterable[str]) -> frozenset[str]:
    """Returns `names` as a set of knob names; raises `InvalidArgumentError` for a name that
    is not one of `KNOBS`."""
    chosen = frozenset(names)
    unknown = sorted(chosen - set(KNOBS))
    if unknown:
        raise InvalidArgumentError(
            f"unknown knob(s) {', '.join(unknown)}; choose from {', '.join(KNOBS)}"
        )
    return chosen
