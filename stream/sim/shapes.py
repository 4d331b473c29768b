"""BUGGIFY fault shapes that span several steps of a random run: each starts from whatever the
run is doing now, chains a few faults whose order matters, and draws every duration and choice
from the run's generator. They are faults of the model like any other (a writer dying right
after a batch left, a replacement failing right after it joined), so a run with every
protection on must stay clean under them; with a protection off they reach the shape its
directed scenario (`stream.sim.scenarios`) shows it guards.

`RandomWorkload` (`stream.sim.runner`) adds them to its actions when their knob is on
(`stream.sim.buggify`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stream.sim.runner import RandomWorkload


class Shapes:
    """The multi-step faults of one random run."""

    def __init__(self, workload: RandomWorkload) -> None:
        self.workload = workload
        # One shape at a time: a second one would break the first's chain.
        self._busy = False

    def dirty_tail(self) -> None:
        """BUGGIFY (`dirty_tail`): the unbounded-ledgers blog's divergence and docs/design.md
        §5's new-member example start alike. A writer sends a batch that reaches one bookie of
        its ensemble only (its Add streams to the others are held) and dies right after (a
        long pause): that bookie holds a dirty tail no other has. Another writer takes over,
        its fence and reads missing that bookie and its first adds to it held, and appends a
        burst at once, so that its own entries at those ids are acknowledged by the others
        first. The truncate no-op (or the ensemble change replacing that bookie, then the
        new-member truncation when a later fragment takes it back) is what keeps the dirty
        tail out of the log. Only from a calm stretch (a writer open, no takeover running):
        amid other takeovers the batch would reach no one."""
        self._start(self._dirty_tail)

    def _start(self, shape: Callable[[], Awaitable[None]]) -> None:
        """Runs `shape` unless another one is running."""
        if not self._busy:
            self._busy = True
            self.workload.sim.spawn(self._run(shape))

    async def _run(self, shape: Callable[[], Awaitable[None]]) -> None:
        try:
            await shape()
        finally:
            self._busy = False

    async def _pick_calm_writer(self, timeout_s: float) -> str | None:
        """Waits up to `timeout_s` for calm writers (`_calm_writers`) and returns one drawn
        at random, or None when none came or the workload is done."""
        wl = self.workload
        calm = await wl.sim.until(self._calm_writers, timeout_s=timeout_s, step_s=0.005)
        active = self._calm_writers()
        if not calm or not active or wl._done:
            return None
        return wl.rng.choice(active)

    def _calm_writers(self) -> list[str]:
        """Returns the writers open and awake while no takeover or seal runs (none when one
        does, or when there is no other writer to take over)."""
        wl = self.workload
        sim = wl.sim
        now = sim.loop.time()
        if len(wl.writers) < 2 or wl._opening() or wl._sealed:
            return []
        return [
            w
            for w in wl.writers
            if sim.client(w).writer is not None
            and wl._frozen.get(w, 0.0) <= now
            and not sim.network.paused(w)
        ]

    def _settled(self) -> bool:
        """Returns whether every bookie of the last ensemble knows that the whole log is
        fully replicated (its LAFR is the last entry any of them holds): a takeover then
        recovers nothing and writes nothing back, which would replace a bookie it missed."""
        sim = self.workload.sim
        states = [sim.bookies[b].streams.get(sim.stream_id) for b in self.workload._ensemble()]
        if any(state is None for state in states):
            return False
        last = max(state.last_entry_id for state in states if state is not None)
        return all(state.lafr == last for state in states if state is not None)

    async def _dirty_tail(self) -> None:
        wl = self.workload
        sim, rng = wl.sim, wl.rng
        calm = await sim.until(
            lambda: self._calm_writers() and self._settled(), timeout_s=0.5, step_s=0.005
        )
        active = self._calm_writers()
        if not calm or not active or wl._done:
            return
        name = rng.choice(active)
        ensemble = wl._ensemble()
        # A bookie the writer reaches now, and another writer awake to take over.
        reached = [
            b
            for b in ensemble
            if sim.bookies[b].up and sim.network.flows(name, b) and sim.network.flows(b, name)
        ]
        takers = [w for w in wl.writers if w != name and not sim.network.paused(w)]
        if not reached or not takers:
            return
        keep = rng.choice(reached)
        sim.faults += 1
        sim.trace.record("dirty_tail", c=name, keep=keep)
        held_s = rng.uniform(0.3, 1.5)
        for bookie_id in ensemble:
            if bookie_id != keep:
                sim.network.hold_adds(name, bookie_id, held_s)
        # As long a tail as the writer's fragment takes: it cannot roll before its entries
        # are fully replicated, so the tail ends with its fragment.
        first = self._last_held(keep) + 1
        count = sim.append(name, rng.randint(1, 3 * sim.config.fragment_max_entries))
        # The writer dies once its tail reached `keep` (or a little later anyway).
        await sim.until(
            lambda: self._last_held(keep) >= first + count - 1, timeout_s=0.05, step_s=0.001
        )
        await self._die_then_take_over(name, rng.choice(takers), keep, held_s)

    def _last_held(self, bookie_id: str) -> int:
        """Returns the last entry id `bookie_id` holds for the stream (-1: none)."""
        sim = self.workload.sim
        state = sim.bookies[bookie_id].streams.get(sim.stream_id)
        return -1 if state is None else state.last_entry_id

    async def _die_then_take_over(self, dead: str, name: str, keep: str, held_s: float) -> None:
        wl = self.workload
        sim, rng = wl.sim, wl.rng
        sim.pause(dead, held_s + rng.uniform(0.2, 1.5))
        await asyncio.sleep(rng.uniform(0.0, 0.02))
        if wl._done:
            return
        wl._take_from_dirty(keep, [name])
        if rng.random() < 0.5:
            # Cut for longer: the recovery's no-op fails on `keep` at once (no add timeout),
            # which leaves the run time to take `keep` back.
            sim.network.cut(name, keep, rng.uniform(0.1, 0.4))
        opening = sim.client(name).opening
        if opening is None:
            return
        try:
            writer = await asyncio.shield(opening)
        except Exception:
            return
        if writer is None or wl._done:
            return
        # The new writer appends a burst at once, its adds to `keep` late; one of its members
        # may fail meanwhile: the ensemble change may take `keep` back, from the first entry
        # not yet fully replicated, which its dirty tail may reach.
        if rng.random() < 0.5:
            sim.network.slow(name, keep, rng.uniform(0.01, 0.08), rng.uniform(0.2, 1.0))
        sim.append(name, rng.randint(1, 2 * sim.config.fragment_max_entries + 2))
        members = [b for b in wl._ensemble() if b != keep]
        if members and rng.random() < 0.5:
            await asyncio.sleep(rng.uniform(0.0, 0.005))
            sim.network.cut(name, rng.choice(members), rng.uniform(0.05, 0.5))

    def spare_churn(self) -> None:
        """BUGGIFY (`spare_churn`): a writer dies right after its last entries were
        acknowledged (before its LAC went out), so the next takeover writes them back; its
        write-backs to one member are held, so that member is replaced locally, and the
        replacement fails right after it joined (its new-member truncation landed): the member
        replaced away is a spare again, and with few bookies the only one. That takeover then
        dies too, and another recovers with that member answering first. The spare-holders
        rule (never pick a member replaced away by a change the metadata does not hold yet)
        is what keeps its new-member truncation from stripping entries the stored fragment
        still counts on it."""
        self._start(self._spare_churn)

    async def _spare_churn(self) -> None:
        wl = self.workload
        sim, rng = wl.sim, wl.rng
        dead = await self._pick_calm_writer(timeout_s=0.5)
        if dead is None:
            return
        writer = sim.client(dead).writer
        takers = [w for w in wl.writers if w != dead and not sim.network.paused(w)]
        if writer is None or not takers:
            return
        sim.faults += 1
        sim.trace.record("spare_churn", c=dead)
        acks = sim.checker.ack_count + sim.append(dead, rng.randint(1, 4))
        await sim.until(lambda: sim.checker.ack_count >= acks, timeout_s=0.2, step_s=0.0005)
        last = writer.last_add_confirmed
        sim.pause(dead, rng.uniform(1.0, 2.0))  # before its LAC leaves
        if wl._done:
            return
        name = rng.choice(takers)
        stored = wl._ensemble()
        # A member up that holds the last entry, reached by the takeover but for its adds.
        holders = [
            b
            for b in stored
            if sim.holds(b, last) is not None
            and sim.network.flows(name, b)
            and sim.network.flows(b, name)
        ]
        # Every other member is up and reached: the one replacement is `member`'s.
        if not holders or len(holders) < len(stored) - 1:
            return
        member = rng.choice(holders)
        if any(not sim.bookies[b].up for b in stored if b != member):
            return
        # Its adds to `member` and to the spares are held: the replacement joins (the
        # new-member truncation is not an add) and takes nothing before it fails.
        held_s = rng.uniform(0.4, 1.0)
        for bookie_id in sim.bookies:
            if bookie_id == member or bookie_id not in stored:
                sim.network.hold_adds(name, bookie_id, held_s)
        sim.start_takeover(name)
        term = sim.snapshot()[0].term + 1

        def joined() -> list[str]:
            return [
                b
                for b, bookie in sim.bookies.items()
                if b not in stored
                and (state := bookie.streams.get(sim.stream_id)) is not None
                and state.term >= term
            ]

        if not await sim.until(joined, timeout_s=0.6, step_s=0.001) or wl._done:
            return
        replacement = rng.choice(joined())
        await asyncio.sleep(rng.uniform(0.003, 0.01))  # its answer is back: it joined
        sim.trace.record("spare_churn_joined", c=name, b=replacement, member=member)
        sim.network.cut(name, replacement, rng.uniform(0.2, 0.6))
        # The takeover dies once `member` lost an entry it held (or a little later anyway).
        held = [e for e in range(last + 1) if sim.holds(member, e) is not None]
        if await sim.until(
            lambda: any(sim.holds(member, e) is None for e in held), timeout_s=0.1, step_s=0.001
        ):
            sim.trace.record("spare_churn_lost", b=member)
        sim.pause(name, rng.uniform(0.5, 1.5))
        others = [w for w in wl.writers if w not in (dead, name)]
        if others and not wl._done:
            # The next takeover hears `member` first.
            taker = rng.choice(others)
            for bookie_id in sim.bookies:
                if bookie_id != member:
                    sim.network.slow(taker, bookie_id, 0.02, rng.uniform(0.1, 0.5))
            sim.start_takeover(taker)

    def pinned_pair(self) -> None:
        """BUGGIFY (`pinned_pair`): docs/design.md §5's pinning with two failed members. A
        writer's Add stream to one member is held: the entries the others acknowledge are
        committed but not on their whole write set, so those others are pinned. Then the
        first member in ensemble order is cut off: it fails at once, pinned, and the held one
        fails at its add timeout, not pinned. Replacing the held one first (unpinned-first)
        lets LAFR advance, which frees the first; waiting on the first instead ends past the
        ensemble change's deadline in NotEnoughBookiesError, with spares free (the
        needless-give-up property, `stream.sim.give_up`)."""
        self._start(self._pinned_pair)

    async def _pinned_pair(self) -> None:
        wl = self.workload
        sim, rng = wl.sim, wl.rng
        name = await self._pick_calm_writer(timeout_s=0.3)
        if name is None:
            return
        writer = sim.client(name).writer
        pipeline = None if writer is None else writer.pipeline
        if pipeline is None or pipeline.closed or pipeline.failed:
            return
        first, *others = pipeline.ensemble
        held = rng.choice(others)
        sim.faults += 1
        sim.trace.record("pinned_pair", c=name, first=first, held=held)
        # Both outlast the ensemble change's deadline: waiting on `first` cannot end well.
        duration_s = rng.uniform(0.8, 1.5)
        sim.network.hold_adds(name, held, duration_s)
        acks = sim.checker.ack_count + sim.append(name, rng.randint(2, 6))
        await sim.until(lambda: sim.checker.ack_count >= acks, timeout_s=0.1, step_s=0.001)
        if wl._done:
            return
        sim.network.cut(name, first, duration_s)
        sim.append(name, rng.randint(1, 5))
