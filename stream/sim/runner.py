"""Seeded simulation runs: `run_seed(seed, steps, disabled)` builds a random cluster, drives a
random workload with random faults against the real client, checks the properties after every
step and at the end, and returns a `RunResult`; `run_many` runs a range of seeds (in worker
processes when asked) and stops at the first failing seed when asked.

A seed replays identically: the same seed gives the same trace digest. Nothing reads real
time or global randomness; every choice comes from `random.Random(seed)`.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import math
import multiprocessing
import os
import random
import sys
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from stream.bookie.unsafe import UNSAFE_SWITCHES
from stream.errors import InvalidArgumentError, StorageError
from stream.sim.buggify import (
    FAULT_SPACE_KNOBS,
    LATE_KNOBS,
    Knobs,
    check_knobs,
    draw_knobs,
    guarded_shapes,
)
from stream.sim.checker import Violation
from stream.sim.cluster import CLIENT_ERROR, PROTECTIONS, SimConfig, Simulation
from stream.sim.disk import POWER_CUT, DiskFault
from stream.sim.fault_space import TOO_BUSY_CACHE_BYTES, TOO_BUSY_FLUSH_S, FaultSpace
from stream.sim.loop import VirtualTimeLoop, drain
from stream.sim.network import NetworkFaults
from stream.sim.shapes import Shapes

DEFAULT_STEPS = 40

# (E, WQ, AQ) the random runs choose from: striping (E > WQ) and AQ = 1 among them. What a
# crash may lose is bounded by `Simulation.may_lose_data` (fewer than AQ bookies), not here.
_QUORUMS = (
    (3, 3, 2),
    (3, 2, 2),
    (4, 3, 2),
    (4, 2, 2),
    (5, 3, 2),
    (5, 2, 2),
    (3, 3, 3),
    (2, 2, 1),
    (3, 2, 1),
    (3, 3, 1),
)


# Typical journal fdatasync durations (virtual seconds) the random runs choose from: instant
# (the schedules of the runs before syncs took time), a fast SSD, an SSD under load, a disk.
# Appends are acknowledged that much after they were written, and the records arriving
# meanwhile form the next group commit.
_JOURNAL_SYNC_S = (0.0, 0.0002, 0.001, 0.004)
_DISK_FAULTS: tuple[DiskFault, ...] = ("read_only", "full")


@dataclass(frozen=True)
class RunResult:
    """What one seeded run did and found."""

    seed: int
    steps: int
    faults: int
    acknowledged: int
    violations: tuple[Violation, ...]
    trace_digest: str
    virtual_time_s: float = 0.0
    events: int = 0
    scenario: str = "random"
    config: str = ""
    # The last trace events, kept only when the run failed (for the report).
    trace_tail: tuple[str, ...] = field(default=(), compare=False)

    @property
    def ok(self) -> bool:
        return not self.violations


def check_disabled(disabled: Iterable[str]) -> frozenset[str]:
    """Returns `disabled` as a set of protection names; raises `InvalidArgumentError` for a
    name that is not one of `PROTECTIONS`."""
    names = frozenset(disabled)
    unknown = sorted(names - set(PROTECTIONS))
    if unknown:
        raise InvalidArgumentError(
            f"unknown protection(s) {', '.join(unknown)}; choose from {', '.join(PROTECTIONS)}"
        )
    return names


def check_bookie_switches(names: Iterable[str]) -> frozenset[str]:
    """Returns `names` as a set of the bookie's test-only switches; raises
    `InvalidArgumentError` for a name that is not one of `UNSAFE_SWITCHES`."""
    switches = frozenset(names)
    unknown = sorted(switches - UNSAFE_SWITCHES)
    if unknown:
        raise InvalidArgumentError(
            f"unknown bookie switch(es) {', '.join(unknown)}; "
            f"choose from {', '.join(sorted(UNSAFE_SWITCHES))}"
        )
    return switches


def random_config(rng: random.Random, disabled: frozenset[str]) -> SimConfig:
    """Returns a random cluster shape, stream and network for one run."""
    ensemble, write_quorum, ack_quorum = rng.choice(_QUORUMS)
    bookies = ensemble + rng.choice((1, 2, 2, 3))
    ids = [f"b{i}" for i in range(1, bookies + 1)]
    journal_less: frozenset[str] = frozenset()
    # AQ = 1 places on journaled bookies only (one acknowledgment must be durable).
    if rng.random() < 0.5 and ack_quorum > 1:
        journal_less = frozenset(b for b in ids if rng.random() < 0.5)
    faults = NetworkFaults(
        spike_rate=rng.choice((0.0, 0.02, 0.1)),
        spike_max_s=rng.choice((0.02, 0.08)),
        loss_rate=rng.choice((0.0, 0.0, 0.002, 0.01, 0.03)),
        duplicate_rate=rng.choice((0.0, 0.05)),
    )
    return SimConfig(
        bookies=bookies,
        ensemble=ensemble,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        fragment_max_entries=rng.choice((3, 5, 8, 13, 50)),
        journal_less=journal_less,
        flush_interval_s=rng.choice((0.1, 0.3, 1.0)),
        faults=faults,
        disabled=disabled,
        journal_sync_s=rng.choice(_JOURNAL_SYNC_S),
    )


def describe(config: SimConfig) -> str:
    """Returns a one-line description of a cluster shape (for reports)."""
    f = config.faults
    return (
        f"E={config.ensemble} WQ={config.write_quorum} AQ={config.ack_quorum} "
        f"bookies={config.bookies} fragment_max_entries={config.fragment_max_entries} "
        f"journal_less={','.join(sorted(config.journal_less)) or '-'} "
        f"journal_sync_ms={config.journal_sync_s * 1000:g} loss={f.loss_rate} "
        f"dup={f.duplicate_rate} spikes={f.spike_rate}"
    )


class RandomWorkload:
    """Random steps: appends, reads, seals, competing takeovers and faults of every kind, with
    the run's BUGGIFY knobs (`stream.sim.buggify`) biasing them toward rare shapes."""

    def __init__(
        self, sim: Simulation, rng: random.Random, *, reengage: bool = False, knobs: Knobs
    ) -> None:
        """With `reengage`, every writer takes the stream over again when superseded (the
        client's `reengage=True`), so writers keep competing to the end."""
        self.sim = sim
        self.rng = rng
        self.reengage = reengage
        self.knobs = knobs
        self.writers = [f"c{i}" for i in range(1, rng.choice((2, 3, 3)) + 1)]
        self.readers = ["r1", "r2"]
        self._sealed = False
        # Writers frozen by `zombie`, until when.
        self._frozen: dict[str, float] = {}
        self._done = False
        self._actions: list[tuple[int, Callable[[], None]]] = [
            (40, self.append),
            (8, self.read),
            (6, self.takeover),
            (5, self.crash),
            (5, self.pause),
            (2, self.swizzle),
            (5, self.partition),
            (4, self.clog),
            (2, self.expire),
            (2, self.lose_zk_reply),
        ]
        if knobs.hold_adds:
            self._actions.append((6, self.hold_adds))
        if knobs.placement:
            self._actions.append((4, self.flip_read_only))
        if knobs.seal:
            self._actions.append((1, self.seal))
        if knobs.disk_faults:
            self._actions.append((3, self.disk_fault))
        if knobs.slow_bookie:
            self._actions.append((4, self.slow_bookie))
        # Further streams, trims, deletes and services (`stream.sim.fault_space`).
        self.space: FaultSpace | None = None
        if FaultSpace.wanted(knobs):
            self.space = FaultSpace(
                sim, random.Random(rng.getrandbits(64)), knobs, reengage=reengage
            )
            self._actions.extend(self.space.actions())
        shapes = Shapes(self)
        if knobs.dirty_tail:
            self._actions.append((30, shapes.dirty_tail))
        if knobs.spare_churn:
            self._actions.append((30, shapes.spare_churn))
        # The storage jobs' faults.
        if knobs.torn_jobs or knobs.torn_journal_less:
            self._actions.append((5, self.crash_mid_job))
        if knobs.pinned_pair:
            self._actions.append((30, shapes.pinned_pair))
        self._weights = [w for w, _ in self._actions]

    async def run(self, steps: int) -> None:
        sim = self.sim
        sim.trace.record("knobs", on=",".join(self.knobs.names()) or "-")
        self.takeover(self.writers[0])
        if self.space is not None:
            await self.space.start()
        for _ in range(steps):
            if not self._sealed and not self._writing() and not self._opening():
                self.takeover()
            else:
                ((_, action),) = self.rng.choices(self._actions, weights=self._weights)
                action()
            await asyncio.sleep(self.rng.uniform(0.002, 0.04))
            sim.check()
        self._done = True
        if self.space is not None:
            self.space.stopped = True
        for bookie_id in sorted(sim.read_only):
            sim.set_read_only(bookie_id, False)  # the final takeover needs its placement

    def _later(self, delay_s: float, action: Callable[..., object], *args: object) -> None:
        """Runs `action(*args)` after `delay_s`, unless the random steps are over by then (the
        run's end heals every fault)."""

        def run() -> None:
            if not self._done:
                action(*args)

        self.sim.loop.call_later(delay_s, run)

    def _writing(self) -> bool:
        return any(self.sim.client(w).writer for w in self.writers)

    def _opening(self) -> bool:
        return any(
            (c := self.sim.client(w)).opening is not None and not c.opening.done()
            for w in self.writers
        )

    def _ensemble(self) -> tuple[str, ...]:
        """Returns the last fragment's ensemble (every bookie before the first one)."""
        fragments = self.sim.snapshot()[2]
        return tuple(fragments[-1].ensemble if fragments else sorted(self.sim.bookies))

    def _target(self) -> str:
        """Returns a bookie to aim a fault at: most often the one holding the longest log (the
        dirty data every protection is about), else one of the last ensemble."""
        sim = self.sim
        if self.rng.random() < 0.6:
            lasts = {
                b: state.last_entry_id
                for b, bookie in sim.bookies.items()
                if (state := bookie.streams.get(sim.stream_id)) is not None
            }
            if lasts:
                longest = max(lasts.values())
                return self.rng.choice(sorted(b for b, last in lasts.items() if last == longest))
        return self.rng.choice(self._ensemble())

    # ------------------------------------------------------------------ actions

    def append(self) -> None:
        # A writer frozen right after its takeover (`zombie`) appends nothing until it wakes:
        # it opens no Add stream a bookie's crash would break before it writes.
        now = self.sim.loop.time()
        active = [
            w
            for w in self.writers
            if self.sim.client(w).writer is not None and self._frozen.get(w, 0.0) <= now
        ]
        if active:
            self.sim.append(self.rng.choice(active), self.rng.randint(1, 5))

    def read(self) -> None:
        self.sim.spawn(self.sim.read(self.rng.choice(self.readers), self.rng.randint(3, 20)))

    def takeover(self, name: str | None = None, *, against: Sequence[str] = ()) -> None:
        """Starts a takeover by `name` (a random writer when None), shaped by the knobs, or
        `against` a zombie whose next entry's write set that is (see `_compete`)."""
        name = name or self.rng.choice(self.writers)
        client = self.sim.client(name)
        if client.opening is not None and not client.opening.done():
            return
        wipe = self._compete(name, against) if against else self._shape_recovery(name)
        self.sim.start_takeover(name, reengage=self.reengage)
        opening = client.opening
        assert opening is not None
        self.sim.spawn(self._after_takeover(name, opening, wipe))

    def seal(self, *, against: Sequence[str] = ()) -> None:
        if self._sealed:
            return
        now = self.sim.loop.time()
        awake = [w for w in self.writers if self._frozen.get(w, 0.0) <= now]
        name = self.rng.choice(awake or self.writers)
        self._sealed = True
        wipe = self._compete(name, against) if against else self._shape_recovery(name)
        self.sim.spawn(self._seal(name, wipe))

    async def _seal(self, name: str, wipe: Callable[[], None] | None) -> None:
        if await self.sim.seal(name):
            self._wipe_soon(wipe)

    def _take_from_dirty(self, dirty: str, writers: Sequence[str] = ()) -> None:
        """BUGGIFY: another writer (one of `writers`, default any) takes over while `dirty`
        alone holds the dead writer's tail (the unbounded-ledgers blog's divergence): its
        fence misses `dirty`, and its first adds to it are held, so that its first entries are
        acknowledged by the others beside `dirty`'s dirty ones, unless the truncate no-op (or,
        when `dirty` comes back in a later fragment, the new-member truncation) clears them."""
        name = self.rng.choice(writers or self.writers)
        client = self.sim.client(name)
        if client.opening is not None and not client.opening.done():
            return
        self.sim.faults += 1
        self.sim.network.cut(name, dirty, self.rng.uniform(0.02, 0.15))
        self.sim.network.hold_adds(name, dirty, self.rng.uniform(0.1, 0.8))
        self.sim.start_takeover(name, reengage=self.reengage)

    def _shape_recovery(self, name: str) -> Callable[[], None] | None:
        """BUGGIFY for a takeover by `name`: its fence and reads miss one bookie, its reads
        are answered by one bookie first, or its write-backs to one are held. Returns the
        disk wipe to try once it is done: one of the other bookies."""
        knobs, rng, network = self.knobs, self.rng, self.sim.network
        target = self._target()
        missed = set()
        if knobs.isolate and rng.random() < 0.5:
            self.sim.faults += 1
            network.cut(name, target, rng.uniform(0.05, 0.6))
            missed.add(target)
        elif knobs.favor and rng.random() < 0.5:
            for bookie_id in self.sim.bookies:
                if bookie_id != target:
                    network.slow(name, bookie_id, 0.02, rng.uniform(0.1, 0.8))
        if knobs.hold_adds and rng.random() < 0.5:
            # Most often to the bookie it missed: the new term's first entries then reach
            # the others only, beside that bookie's dirty ones.
            self.sim.faults += 1
            held = target if rng.random() < 0.6 else rng.choice(self._ensemble())
            network.hold_adds(name, held, rng.uniform(0.01, 0.8))
            spares = sorted(set(self.sim.bookies) - set(self._ensemble()))
            if spares and rng.random() < 0.5:
                # The bookie that replaces the held one fails at once: the one replaced away
                # is the spare left (what the spare-holders rule guards).
                self._later(rng.uniform(0.01, 0.2), network.cut, name, rng.choice(spares), 0.3)
        if not (knobs.wipe and rng.random() < 0.7):
            return None
        others = sorted(set(self.sim.bookies) - missed)
        return lambda: self._wipe(others)

    def _compete(self, name: str, ensemble: Sequence[str]) -> Callable[[], None] | None:
        """BUGGIFY for a takeover (or seal) by `name` against a frozen writer whose next entry
        goes to `ensemble` (BP-46's lost fence): its fence and reads miss one of them, which
        keeps the old term; its write-backs to another may be held (that one is replaced
        away, no fragment names it). Returns the disk wipe to try once it is done: the held
        one, or another bookie than the one it missed, so that the wiped bookie forgets the
        new term unless phase one or the wiped-term check gives it back."""
        rng, network = self.rng, self.sim.network
        self.sim.faults += 1
        missed = rng.choice(ensemble)
        self.sim.trace.record("compete", c=name, missed=missed)
        network.cut(name, missed, rng.uniform(0.3, 0.8))
        rest = [b for b in ensemble if b != missed]
        if rest and rng.random() < 0.5:
            held = rng.choice(rest)
            network.hold_adds(name, held, rng.uniform(0.3, 0.8))
            rest = [held]
        if rng.random() < 0.2:
            return None
        return lambda: self._wipe(rest)

    async def _after_takeover(
        self, name: str, opening: asyncio.Task[Any], wipe: Callable[[], None] | None
    ) -> None:
        """BUGGIFY after a takeover: the new writer freezes before it writes while a
        competitor takes over or seals (a zombie with no connection yet), or a bookie loses
        its disk as the new term begins (`wipe`)."""
        try:
            writer = await asyncio.shield(opening)
        except Exception:
            return
        if writer is None:
            return
        if self.knobs.zombie and self.rng.random() < 0.5:
            frozen_s = self.rng.uniform(0.3, 1.5)
            self._frozen[name] = self.sim.loop.time() + frozen_s
            self.sim.pause(name, frozen_s)
            others = [w for w in self.writers if w != name]
            if others and self.rng.random() < 0.8:
                # The bookies its next entry goes to: where the lost fence lets it commit.
                meta, _, fragments = self.sim.snapshot()
                write_set = meta.quorum.write_set_bookies(
                    fragments[-1].ensemble, writer.last_add_confirmed + 1
                )
                await asyncio.sleep(self.rng.uniform(0.0, 0.05))
                if self.knobs.seal and self.rng.random() < 0.5:
                    self.seal(against=write_set)
                else:
                    self.takeover(self.rng.choice(others), against=write_set)
                return
        self._wipe_soon(wipe)

    def _wipe_soon(self, wipe: Callable[[], None] | None) -> None:
        if wipe is not None:
            self._later(self.rng.uniform(0.0, 0.05), wipe)

    def _wipe(self, candidates: Iterable[str]) -> None:
        """Wipes the disk of one of `candidates` that is up, within the loss budget."""
        sim = self.sim
        up = [b for b in candidates if sim.bookies[b].up and sim.may_lose_data(b)]
        if up:
            bookie_id = self.rng.choice(up)
            sim.crash(bookie_id, lose_disk=True, downtime_s=self.rng.uniform(0.01, 0.2))

    def _crashable(self) -> list[str]:
        """Returns the bookies that are up, when one more may go down (none otherwise)."""
        sim = self.sim
        up = [b for b, bookie in sim.bookies.items() if bookie.up]
        down = len(sim.bookies) - len(up)
        max_down = len(sim.bookies) - 1 if self.knobs.outage else 2
        return up if down < max_down else []

    def crash(self) -> None:
        sim = self.sim
        up = self._crashable()
        if not up:
            return
        downtime_s = self.rng.uniform(0.05, 1.0)
        bookie_id = self.rng.choice(up)
        lossless = sim.bookies[bookie_id].journal_write_data
        if self.rng.random() < 0.15:
            sim.stop_cleanly(bookie_id, downtime_s)  # an orderly restart
        elif sim.may_lose_data(bookie_id) and self.rng.random() < 0.6:
            # A crash that may lose data: the unflushed entries of a bookie without the
            # journal, or a whole disk.
            lose_disk = self.rng.random() < 0.25
            sim.crash(bookie_id, lose_disk=lose_disk, downtime_s=downtime_s)
        elif lossless:
            sim.crash(bookie_id, downtime_s=downtime_s)

    def crash_mid_job(self) -> None:
        """BUGGIFY `torn_jobs` (journaled bookies) and `torn_journal_less` (the others): a
        bookie (most often the one with the longest log) crashes in the middle of its storage
        work, at one of its disk's next syncs: between a journal group's writes and its
        fdatasync, an entry log's writes and its sync, the entry logs and the index commit."""
        up = [b for b in self._crashable() if self._tearable(b)]
        target = self._target()
        bookie_id = target if target in up else self.rng.choice(up) if up else None
        if bookie_id is None:
            return
        self.sim.crash_at_sync(
            bookie_id,
            # Most often the next sync: the group commit of the adds arriving now.
            self.rng.choice((0, 0, 0, 1, 2, 3)),
            downtime_s=self.rng.uniform(0.05, 1.0),
            within_s=self.rng.uniform(0.05, 0.5),
        )

    def _tearable(self, bookie_id: str) -> bool:
        """Returns whether the knobs let a power cut land on `bookie_id`. A journaled bookie
        promises to lose nothing it acknowledged, wherever the cut lands; a journal-less one
        only to forget no term it served (`stream.sim.answered_terms`): what it had not
        flushed is the loss budget's."""
        if self.sim.bookies[bookie_id].journal_write_data:
            return self.knobs.torn_jobs
        return self.knobs.torn_journal_less and self.sim.may_lose_data(bookie_id)

    def hold_adds(self) -> None:
        """A writer's Add streams to all but one bookie of its ensemble (or to one) are held
        for a while: the entries meanwhile reach a subset of their write sets only."""
        self.sim.faults += 1
        name = self.rng.choice(self.writers)
        ensemble = self._ensemble()
        duration_s = self.rng.uniform(0.02, 0.6)
        if self.rng.random() < 0.5:
            held = [self.rng.choice(ensemble)]
        else:
            keep = self._target()
            held = [b for b in ensemble if b != keep]
            if self.rng.random() < 0.5:
                # The writer dies with its tail on `keep` only, and another takes over (most
                # often missing `keep`): a dirty tail that a later fragment may take `keep`
                # back over (new-member truncation) or a recovery may read first.
                self.sim.pause(name, duration_s + self.rng.uniform(0.1, 1.0))
                self._later(self.rng.uniform(0.01, duration_s), self._take_from_dirty, keep)
        for bookie_id in held:
            self.sim.network.hold_adds(name, bookie_id, duration_s)

    def slow_bookie(self) -> None:
        """One bookie (most often the one with the longest log) answers every writer late
        for a while: the others' acknowledgments move the LAC past entries it still holds
        dirty, or has not got yet."""
        bookie_id = self._target()
        extra_s = self.rng.uniform(0.01, 0.08)
        duration_s = self.rng.uniform(0.2, 1.5)
        for name in self.writers:
            self.sim.network.slow(name, bookie_id, extra_s, duration_s)

    def disk_fault(self) -> None:
        """A bookie's disk turns read-only or full for a while: it refuses adds."""
        sim = self.sim
        bookie_id = self.rng.choice(sorted(sim.bookies))
        kind: DiskFault = self.rng.choice(_DISK_FAULTS)
        if not sim.bookies[bookie_id].journal_write_data:
            # A full disk may fail its storage, and the restart that ends that loses what a
            # journal-less bookie had not flushed, and puts its streams in limbo: lossy
            # crashes are the crash faults' to draw, within the loss budget.
            kind = "read_only"
        sim.set_disk_fault(bookie_id, kind, self.rng.uniform(0.05, 1.0))

    def flip_read_only(self) -> None:
        """A bookie turns read-only, or writable again, keeping E writable ones."""
        sim = self.sim
        bookie_id = self.rng.choice(sorted(sim.bookies))
        if bookie_id in sim.read_only:
            sim.set_read_only(bookie_id, False)
        elif len(sim.bookies) - len(sim.read_only) > sim.config.ensemble:
            sim.set_read_only(bookie_id, True)

    def pause(self) -> None:
        # A writer stops (GC pause, VM freeze) and wakes up later: a zombie.
        self.sim.pause(self.rng.choice(self.writers), self.rng.uniform(0.05, 1.5))

    def swizzle(self) -> None:
        self.sim.faults += 1
        self.sim.spawn(self._swizzle())

    async def _swizzle(self) -> None:
        """FoundationDB's swizzle-clog: clog a random subset of nodes one by one, then unclog
        them in a random order."""
        nodes = [*self.writers, *self.sim.bookies]
        chosen = self.rng.sample(nodes, self.rng.randint(2, max(2, len(nodes) // 2)))
        for node in chosen:
            self.sim.network.clog_node(node, math.inf)
            await asyncio.sleep(self.rng.uniform(0.005, 0.1))
        self.rng.shuffle(chosen)
        for node in chosen:
            self.sim.network.unclog_node(node)
            await asyncio.sleep(self.rng.uniform(0.005, 0.1))

    def _link(self) -> tuple[str, str]:
        clients = self.writers
        if self.knobs.reader_faults:
            clients = [*self.writers, *self.readers]
        return self.rng.choice(clients), self.rng.choice(list(self.sim.bookies))

    def partition(self) -> None:
        a, b = self._link()
        self.sim.faults += 1
        both = self.rng.random() < 0.7
        self.sim.network.cut(a, b, self.rng.uniform(0.02, 0.8), both=both)

    def clog(self) -> None:
        a, b = self._link()
        self.sim.faults += 1
        self.sim.network.clog(a, b, self.rng.uniform(0.02, 0.5), both=self.rng.random() < 0.5)

    def expire(self) -> None:
        if self.rng.random() < 0.3:
            # A bookie's session: it keeps serving, unregistered for a while.
            bookie_id = self.rng.choice(sorted(self.sim.bookies))
            self.sim.expire_bookie_session(bookie_id, self.rng.uniform(0.05, 1.0))
            return
        self.sim.expire_session(self.rng.choice(self.writers), self.rng.uniform(0.01, 0.3))

    def lose_zk_reply(self) -> None:
        self.sim.lose_zk_reply(self.rng.choice(self.writers))


def _result(
    sim: Simulation, steps: int, scenario: str, config: SimConfig, loop: VirtualTimeLoop
) -> RunResult:
    violations = tuple(sim.violations())
    return RunResult(
        seed=sim.seed,
        steps=steps,
        faults=sim.faults,
        acknowledged=sim.acknowledged(),
        violations=violations,
        trace_digest=sim.trace.digest(),
        virtual_time_s=round(loop.time(), 6),
        events=sim.trace.events,
        scenario=scenario,
        config=describe(config),
        trace_tail=tuple(sim.trace.tail(200)) if violations else (),
    )


def run_simulation(
    seed: int,
    config: SimConfig,
    script: Callable[[Simulation], object],
    *,
    steps: int,
    scenario: str,
) -> RunResult:
    """Runs `script(sim)` (a coroutine function driving the simulation, `finish()` included)
    on a fresh virtual-time loop and returns the result."""
    global _current
    loop = VirtualTimeLoop()
    holder: list[Simulation] = []

    async def main() -> None:
        global _current
        sim = Simulation(seed, config)
        holder.append(sim)
        _current = sim
        await sim.start()
        try:
            await script(sim)  # type: ignore[misc]
        finally:
            await sim.shutdown()

    try:
        loop.run_until_complete(main())
        # Callbacks that ran as `main` returned may have started tasks: none is left to be
        # finalized later on another run's loop.
        drain(loop)
    finally:
        _current = None
        loop.close()
    return _result(holder[0], steps, scenario, config, loop)


def run_seed(
    seed: int,
    steps: int = DEFAULT_STEPS,
    disabled: Iterable[str] = (),
    *,
    reengage: bool = False,
    buggify: bool = True,
    knobs: Iterable[str] = (),
    knobs_off: Iterable[str] = (),
    bookie_switches: Iterable[str] = (),
) -> RunResult:
    """Returns the result of the random run of `seed`: `steps` random actions, then the final
    takeover, read and checks. Same seed, same result (and trace digest). With `reengage`
    the writers re-engage when superseded (another family of runs per seed). The run's
    BUGGIFY knobs are drawn from the seed (all off without `buggify`); those named in `knobs`
    are on whatever the draw, and so are those that reach the shapes a protection in
    `disabled` guards (`stream.sim.buggify.GUARDED_SHAPES`); those in `knobs_off` (and not
    in `knobs`) are off whatever the draw, and so are the wider fault space's
    (`FAULT_SPACE_KNOBS`) while a protection is off. `bookie_switches` are the
    shipping bookie's own test-only switches (`stream.bookie.unsafe`) to turn on, for tests
    that break a rule inside it (`streamctl sim` names only the protections). A seed found
    before a knob existed replays as it was found with that knob in `knobs_off`."""
    disabled_protections = check_disabled(disabled)
    off = disabled_protections | check_bookie_switches(bookie_switches)
    forced = check_knobs(knobs)
    unset = check_knobs(knobs_off) - forced
    master = random.Random(seed)
    config = random_config(random.Random(master.getrandbits(64)), off)
    workload_seed = master.getrandbits(64)
    drawn = draw_knobs(random.Random(master.getrandbits(64))) if buggify else Knobs()
    if buggify:
        forced |= guarded_shapes(off)
    if buggify and off:
        unset |= LATE_KNOBS
    if buggify and disabled_protections:
        # A search with a protection off spends its seeds on the shapes it guards: the wider
        # fault space (`FAULT_SPACE_KNOBS`) only dilutes them, unless asked for by name.
        unset |= FAULT_SPACE_KNOBS
    run_knobs = replace(drawn, **dict.fromkeys(forced, True))
    if buggify:
        run_knobs = replace(run_knobs, **dict.fromkeys(unset - forced, False))
    if run_knobs.too_busy:
        config = replace(
            config, write_cache_max_bytes=TOO_BUSY_CACHE_BYTES, flush_delay_s=TOO_BUSY_FLUSH_S
        )

    async def script(sim: Simulation) -> None:
        workload = RandomWorkload(
            sim, random.Random(workload_seed), reengage=reengage, knobs=run_knobs
        )
        await workload.run(steps)
        await sim.finish()

    scenario = "random-reengage" if reengage else "random"
    result = run_simulation(seed, config, script, steps=steps, scenario=scenario)
    knob_names = ",".join(run_knobs.names()) or "-"
    return replace(result, config=f"{result.config} knobs={knob_names}")


@dataclass(frozen=True)
class _Job:
    seed: int
    steps: int
    disabled: frozenset[str]
    reengage: bool
    buggify: bool
    knobs: frozenset[str]
    bookie_switches: frozenset[str] = frozenset()
    knobs_off: frozenset[str] = frozenset()


def _run_one(job: _Job) -> RunResult:
    return run_seed(
        job.seed,
        job.steps,
        job.disabled,
        reengage=job.reengage,
        buggify=job.buggify,
        knobs=job.knobs,
        knobs_off=job.knobs_off,
        bookie_switches=job.bookie_switches,
    )


def run_many(
    seeds: Iterable[int],
    steps: int = DEFAULT_STEPS,
    disabled: Iterable[str] = (),
    *,
    workers: int = 1,
    stop_on_failure: bool = True,
    reengage: bool = False,
    buggify: bool = True,
    knobs: Iterable[str] = (),
    knobs_off: Iterable[str] = (),
    bookie_switches: Iterable[str] = (),
) -> Iterator[RunResult]:
    """Yields the result of each seed in order (computed in `workers` processes when > 1);
    with `stop_on_failure`, stops after the first failing seed. `buggify`, `knobs`,
    `knobs_off` and `bookie_switches` as `run_seed`."""
    off = check_disabled(disabled)
    forced = check_knobs(knobs)
    unset = check_knobs(knobs_off)
    switches = check_bookie_switches(bookie_switches)
    jobs = (_Job(seed, steps, off, reengage, buggify, forced, switches, unset) for seed in seeds)
    if workers <= 1:
        for job in jobs:
            result = _run_one(job)
            yield result
            if stop_on_failure and not result.ok:
                return
        return
    context = multiprocessing.get_context("fork")
    # gc.freeze in each worker: a forked worker inherits its parent's heap, and collecting
    # the parent's leftovers (a test session's clients, threads and their finalizers) made
    # a worker 25x slower after the integration tests (400 seeds: 13 s frozen, > 300 s not).
    with context.Pool(workers, initializer=gc.freeze) as pool:
        for result in pool.imap(_run_one, jobs, chunksize=8):
            yield result
            if stop_on_failure and not result.ok:
                pool.terminate()
                return


# The simulation running now in this process, told about the client's error logs.
_current: Simulation | None = None


# What a full or read-only simulated disk raises in the bookie's storage engine.
_INJECTED_DISK_ERRORS = frozenset({errno.ENOSPC, errno.EROFS})


def _injected_disk_error(error: BaseException | None) -> bool:
    """Returns whether `error` is (or was caused by) a full or read-only simulated disk, or a
    simulated power cut. The journal hands its failure on in a `StorageError` that only names
    it."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in _INJECTED_DISK_ERRORS:
            return True
        if POWER_CUT in str(error):  # the storage's last words before a simulated power cut
            return True
        if isinstance(error, StorageError) and any(
            os.strerror(code) in str(error) for code in _INJECTED_DISK_ERRORS
        ):
            return True
        error = error.__cause__ or error.__context__
    return False


def _capture_errors(logger: object, method_name: str, event_dict: MutableMapping[str, Any]) -> Any:
    """A structlog processor: an error the client logs during a run (an unexpected exception
    in a writer task, say) becomes a `client-error` violation of that run."""
    sim = _current
    if sim is not None and method_name in ("error", "exception", "critical"):
        # The exception being handled, or the one the event names (`exc_info=error`).
        named = event_dict.get("exc_info")
        error = named if isinstance(named, BaseException) else sys.exc_info()[1]
        if _injected_disk_error(error):
            # The real bookie logs the full disk a run put on it, as it should.
            return event_dict
        detail = str(event_dict.get("event"))
        if error is not None:
            detail += f": {error!r}"
        sim.checker.violate(CLIENT_ERROR, f"the client logged {detail}")
    return event_dict


def _drop(logger: object, method_name: str, event_dict: MutableMapping[str, Any]) -> Any:
    raise structlog.DropEvent


def sim_logging(*, show: bool = False, level: int = logging.WARNING) -> None:
    """Configures structlog for simulations: errors the client logs become `client-error`
    violations; other events are dropped, unless `show`, when events at `level` and above
    are rendered as configured before. (The client logs every failed bookie as a warning,
    and a simulation fails bookies all the time.)"""
    processors: list[Any] = list(structlog.get_config()["processors"]) if show else [_drop]
    processors = [p for p in processors if p is not _capture_errors]
    chain: list[Any] = [_capture_errors, *processors]
    structlog.configure(
        processors=chain,
        wrapper_class=structlog.make_filtering_bound_logger(
            min(level, logging.ERROR) if show else logging.ERROR
        ),
        cache_logger_on_first_use=False,
    )
