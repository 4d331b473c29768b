"""Directed fault schedules: the reference counterexamples as scripts, run by the real client in
the simulated cluster. Random faults alone reach some of them only rarely; a script drives the
network, the bookies and the writers through the exact steps, and the checker judges as in a
random run. With the protection a script targets switched on, the same schedule must pass.

- `blog-divergence` (truncate-noop): the log-divergence example of the unbounded-ledgers blog.
  C1 has e0 on B1-B3 and e1 = B (and e2) on B1 only; C2 takes over without reaching B1,
  finds e0 last, and appends e1 = C acknowledged by B2, B3; B1 still serves B for e1. C3 then
  recovers B from B1 and writes it over the acknowledged C.
- `gwq-divergence` (gwq): the same with the truncate no-op on but counted done at AQ: the no-op
  never reaches B1, which keeps its dirty e1..e3 inside the write sets.
- `design-new-member` (new-member-truncation): docs/design.md §5's example with B1..B5: B1 keeps
  C1's dirty A1..A20, is dropped by C2's recovery, rejoins at C2's roll at e10; C2's
  e10 = X reaches B2, B5 only; C3 reads A10 from B1 and writes it over X.
- `bp46-lost-fence` (phase-one-fence): BP-46 scenario 1 with terms (E=4, WQ=2, AQ=2). C1
  opens and hangs; C2's fence misses one bookie, its recovery ends the stream at e0; another
  bookie loses its disk (its term with it); C1 wakes and gets e0 acknowledged by those two
  after C2 fixed the end.
- `sealed-lost-fence` (wiped-term-check): the same on a SEALED stream, which phase one skips.
  E=4, WQ=2, AQ=2: C1 opens and hangs; C2 seals the stream, its fence missing one bookie of
  e0's write set; the other bookie of that write set loses its disk; C1 wakes and gets e0
  acknowledged by the two after the seal.
- `unnamed-lost-fence` (wiped-term-check): E=WQ=2, AQ=1. C1 opens and hangs; C2's fence
  reaches both bookies, its no-op only one, so the other is replaced with `replaces_last`
  (no fragment names it any more: phase one skips the stream); it loses its disk; C1 wakes
  and gets e0 acknowledged by it alone.
- `unnamed-lost-fence-aq2` (wiped-term-check): the same with E=WQ=3, AQ=2 on five bookies:
  C2's fence misses B3 and its no-op misses B2 and B3, both replaced; B2 loses its disk; C1's
  e0 is acknowledged by B2 (term forgotten) and B3 (never fenced).
- `replaced-member-returns` (spare-holders): E = WQ = AQ = 3 on four bookies. C1's e1 is
  acknowledged by B1-B3 and C1 hangs; C2's recovery replaces B3 (its write-backs held) by B4
  locally, then B4 fails at once and B3, the only spare, is picked again: its new-member
  truncation strips e1, which the stored fragment still counts on B3. C2 hangs; C3's fence
  and read are answered by B3 first, and its one "no entry" ends the stream before e1.
- `double-failure` (keep-failed): two bookies of the writer's ensemble fail in one blip; the
  change replacing the first must not reopen the second's link and forget it failed, or LAFR
  never moves again and the writer hangs (the progress property).
- `pinned-first` (unpinned-first): of two failed bookies the first in ensemble order is
  pinned; the writer must replace the unpinned one first instead of waiting until it gives up.
- `bp46-lost-entry` (limbo): BP-46 scenario 2. e0 is acknowledged by B1 and B3 (B2's copy
  held back); B1 runs without the journal and crashes before a flush, losing e0; C2's
  recovery gets explicit negatives from B1 and B2 and ends the stream before e0.
- `zombie-writer` (term-fencing): C1 pauses, C2 takes over and fixes the end, C1 wakes and
  appends again.
- `lost-noop` (none: all protections on): B1 runs without the journal and holds a dirty e1,
  flushed; C2's recovery writes its NOOP|TRUNCATE at e1 over it, and B1 crashes before its
  next flush: the truncation (journaled) holds, the no-op (not journaled) is lost, and the
  flushed dirty e1 is served again, where every other bookie serves the no-op.
- `limbo-stall` (none: all protections on): two journal-less bookies of a 3/3/2 write set
  crash together after a flush; both come back in limbo and the entry after the end never
  gets QC explicit negatives. The takeover must fail with `StreamInLimboError` (not hang),
  and an accept-loss recovery (`recover --accept-loss`) must end the stall with every
  acknowledged entry kept.
- `rewritten-truncate` (none: all protections on): a recovery that starts below an earlier
  term's truncate no-op (here its EC = 1 fence answer came from a bookie that lost its disk)
  writes that no-op back with its TRUNCATE flag, deleting the committed entries after it on
  the bookies it reaches before reading them.
- `roll-boundary-change` (none: a regression): a capacity roll waits behind a slow bookie
  while a fast one fails; the slow acks bring LAFR to the roll's boundary before the change
  plans, so the change's fragment starts there and the roll must not close it (it used to
  close Fragment(10, last=9) and fail the writer).
- `lost-reply-same-term` (none: a regression): the writer's metadata multi-op lands, its reply
  is lost, and another client's change of the same term (here an operator's retention policy;
  retention's trims and the repairs' ensemble CAS are the same to the writer) lands before the
  writer looks again: at its takeover's `finish_recovery`, at a capacity roll and at an ensemble
  change. The writer must recognise its own landed change and go on.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from stream.client.accept_loss import recover_accepting_loss, survey_loss
from stream.client.recovery import WriterIdentity
from stream.errors import StreamError
from stream.metadata.model import RetentionPolicy, StreamState
from stream.sim.checker import LIVENESS, PROGRESS
from stream.sim.cluster import (
    GWQ,
    KEEP_FAILED,
    LIMBO,
    NEW_MEMBER_TRUNCATION,
    PHASE_ONE_FENCE,
    SPARE_HOLDERS,
    STREAM_NAME,
    TERM_FENCING,
    TRUNCATE_NOOP,
    UNPINNED_FIRST,
    WIPED_TERM_CHECK,
    SimConfig,
    Simulation,
)
from stream.sim.network import NetworkFaults
from stream.sim.runner import RunResult, check_disabled, run_simulation

# Extra latency that makes one bookie answer a reader before the others.
_SLOW_S = 0.02


@dataclass(frozen=True)
class Scenario:
    """A directed schedule: the protection it demonstrates (None: a regression to keep
    passing... or failing, with everything on), its cluster and its script."""

    name: str
    targets: str | None
    summary: str
    config: SimConfig
    script: Callable[[Simulation], Awaitable[None]]


def _quiet_network() -> NetworkFaults:
    return NetworkFaults(latency_min_s=0.0005, latency_max_s=0.002)


def _term(sim: Simulation, bookie_id: str) -> int:
    state = sim.bookies[bookie_id].streams.get(sim.stream_id)
    return 0 if state is None else state.term


def _lafr(sim: Simulation, bookie_id: str) -> int:
    state = sim.bookies[bookie_id].streams.get(sim.stream_id)
    return -1 if state is None else state.lafr


async def _good_prefix(sim: Simulation, name: str, bookies: Iterable[str]) -> int:
    """Appends through `name` until an entry is acknowledged and every one of `bookies` knows
    a LAFR >= 0 (so that a recovery starts after it); returns the last id appended."""
    writer = sim.client(name).writer
    if writer is None:
        return -1
    for _ in range(5):
        target = writer.last_add_confirmed + 1
        sim.append(name, 1)
        await sim.until(lambda t=target: sim.acked(t))  # type: ignore[misc]
        await asyncio.sleep(0.01)
        if all(_lafr(sim, b) >= 0 for b in bookies):
            break
    return writer.last_add_confirmed


async def _dirty_tail(sim: Simulation, dirty: int) -> int:
    """C1 opens on B1-B3 and gets a prefix acknowledged on all three (their LAFR past its
    start), then appends `dirty` entries that reach B1 only, and hangs for good. Returns the
    last id of the prefix."""
    if await sim.open_writer("c1") is None:
        return -1
    good = await _good_prefix(sim, "c1", ("b1", "b2", "b3"))
    for bookie_id in ("b2", "b3"):
        sim.network.hold_adds("c1", bookie_id)
    sim.append("c1", dirty)
    await sim.until(lambda: sim.holds("b1", good + dirty) is not None)
    sim.network.clog_node("c1")
    return good


async def _recover_from(sim: Simulation, name: str, fast: str, slow: Iterable[str]) -> None:
    """Takes over with client `name`, whose reads are answered by `fast` first."""
    for bookie_id in slow:
        sim.network.slow(name, bookie_id, _SLOW_S)
    await sim.open_writer(name)
    for bookie_id in slow:
        sim.network.restore(name, bookie_id)


async def blog_divergence(sim: Simulation, dirty: int = 2) -> None:
    """The blog's log divergence (and, with the no-op on and `dirty` = 3, GWQ's): B1 keeps
    `dirty` entries of C1 past the prefix, one more than C2 appends, so that it also holds
    the longest log when C3 takes over (a recovery reads in bulk from the longest)."""
    sim.set_read_only("b4", True)  # C1's ensemble is B1, B2, B3
    await _dirty_tail(sim, dirty)
    sim.set_read_only("b4", False)  # a replacement for B1, should the recovery want one
    sim.network.cut("c2", "b1")  # C2 never hears from B1 during its recovery
    writer = await sim.open_writer("c2")
    sim.network.restore("c2", "b1")
    if writer is not None:
        sim.network.hold_adds("c2", "b1")  # B1 is slow, not failed: no ensemble change
        first = writer.last_add_confirmed + 1
        sim.append("c2", 1)
        await sim.until(lambda: sim.acked(first), timeout_s=0.2)
        sim.network.clog_node("c2")  # C2 dies before its add reaches B1
        sim.check()  # B1 serves its dirty entry where C2's is acknowledged
    await _recover_from(sim, "c3", "b1", ("b2", "b3"))
    await sim.finish()


async def gwq_divergence(sim: Simulation) -> None:
    """The blog's divergence with the truncate no-op, when it only needs AQ."""
    await blog_divergence(sim, dirty=3)


async def design_new_member(sim: Simulation) -> None:
    """docs/design.md §5's example of why a bookie joining a fragment is truncated first."""
    for bookie_id in ("b4", "b5"):
        sim.set_read_only(bookie_id, True)
    # 1. C1 (term 1): e0 on B1-B3; e1..e20 = A1..A20 reach only B1; C1 dies.
    await _dirty_tail(sim, 20)
    # 2. C2 (term 2): B1 unreachable, so the no-op at e1 goes to B2, B3 and B4 replaces B1.
    sim.set_read_only("b4", False)
    sim.network.cut("c2", "b1")
    writer = await sim.open_writer("c2")
    sim.network.restore("c2", "b1")
    if writer is None:
        await sim.finish()
        return
    # 3. C2 fills its fragment by size and rolls at e10 onto B1, B2, B5 (the only writable
    # bookies then); its e10 = X reaches B2 and B5, not B1; C2 dies.
    for bookie_id in ("b3", "b4"):
        sim.set_read_only(bookie_id, True)
    sim.set_read_only("b5", False)
    first = writer.last_add_confirmed + 1  # right after the no-op, in its new fragment
    sim.append("c2", 8, size=125)  # 8 x 125 bytes fill the fragment: the next one rolls
    await sim.until(lambda: sim.acked(first + 7), timeout_s=0.5)
    sim.network.hold_adds("c2", "b1")
    sim.append("c2", 1, size=125)
    await sim.until(lambda: sim.acked(first + 8), timeout_s=0.5)
    sim.network.clog_node("c2")
    sim.check()
    # 4. C3 (term 3) reads e10, B1 answering first.
    await _recover_from(sim, "c3", "b1", ("b2", "b5"))
    await sim.finish()


async def bp46_lost_fence(sim: Simulation) -> None:
    """BP-46 scenario 1 with terms: a bookie that lost its term lets the old writer commit.

    E=4, WQ=2, AQ=2. The writer never resends to a bookie whose connection broke (it
    replaces it, through a CAS the new term has already invalidated), so the old writer must
    reach the bookie that lost its term over a connection opened after that bookie
    restarted: C1 hangs before its first add, so it has none yet."""
    sim.set_read_only("b5", True)
    if await sim.open_writer("c1") is None:
        return
    ensemble = sim.snapshot()[2][-1].ensemble
    sim.network.clog_node("c1")  # C1 hangs before it writes anything
    sim.set_read_only("b5", False)
    missed = ensemble[0]
    sim.network.cut("c2", missed)  # C2's fence (EC = 3) misses ensemble[0]
    await sim.open_writer("c2")  # e0's recovery read: ensemble[1] says no (QC = 1): end
    sim.network.clog_node("c2")
    lost = ensemble[1]
    sim.crash(lost, lose_disk=True)  # the fence goes with the disk
    sim.restart(lost)
    sim.network.unclog_node("c1")  # C1 wakes up and writes e0 to ensemble[0], ensemble[1]
    sim.append("c1", 1)
    await sim.until(lambda: sim.acked(0), timeout_s=0.3)
    await sim.finish()


async def sealed_lost_fence(sim: Simulation) -> None:
    """BP-46 scenario 1 on a SEALED stream: a wiped bookie forgets the sealed stream's term
    (phase one skips SEALED streams), and the old writer commits after the seal."""
    sim.set_read_only("b5", True)
    if await sim.open_writer("c1") is None:
        return
    ensemble = sim.snapshot()[2][-1].ensemble
    sim.network.clog_node("c1")  # C1 hangs before it writes anything
    sim.set_read_only("b5", False)
    sim.network.cut("c2", ensemble[0])  # C2's fence (EC = 3) misses ensemble[0]
    if not await sim.seal("c2"):
        return
    sim.network.clog_node("c2")
    sim.crash(ensemble[1], lose_disk=True)  # the sealed stream's term goes with the disk
    sim.restart(ensemble[1])
    sim.network.unclog_node("c1")  # C1 writes e0 to ensemble[0], ensemble[1]
    sim.append("c1", 1)
    await sim.until(lambda: sim.acked(0), timeout_s=0.3)
    await asyncio.sleep(0.05)  # C1's explicit LAC, should it have one
    # No final takeover: a SEALED stream takes no writer. Readers must see its sealed end.
    sim.check()
    await sim.read("r1")


async def _replaced_away(sim: Simulation, read_only: tuple[str, ...], *, miss_third: bool) -> None:
    """C1 opens (the `read_only` bookies left out) and hangs before its first add; C2's
    fence misses the third bookie of the ensemble when `miss_third`, its no-op misses the
    second bookie of the ensemble too: both are replaced (`replaces_last`) and no fragment
    names them. The second bookie loses its disk; C1 wakes and writes e0, its answer from the
    first bookie (fenced, INVALID_TERM) slowed down so that the others answer first."""
    for bookie_id in read_only:
        sim.set_read_only(bookie_id, True)
    if await sim.open_writer("c1") is None:
        return
    ensemble = sim.snapshot()[2][-1].ensemble
    sim.network.clog_node("c1")
    for bookie_id in read_only:
        sim.set_read_only(bookie_id, False)
    if miss_third:
        sim.network.cut("c2", ensemble[2])
    sim.network.hold_adds("c2", ensemble[1])  # its Fence (unary) arrives, the no-op does not
    if await sim.open_writer("c2") is None:
        await sim.finish()
        return
    sim.network.clog_node("c2")
    sim.crash(ensemble[1], lose_disk=True)
    sim.restart(ensemble[1])
    sim.network.slow("c1", ensemble[0], _SLOW_S)
    sim.network.unclog_node("c1")
    sim.append("c1", 1)
    await sim.until(lambda: sim.acked(0), timeout_s=0.3)
    await sim.finish()


async def unnamed_lost_fence(sim: Simulation) -> None:
    """A replaced-away bookie (no fragment names it) loses its disk; AQ = 1."""
    await _replaced_away(sim, ("b3",), miss_third=False)


async def unnamed_lost_fence_aq2(sim: Simulation) -> None:
    """A replaced-away bookie loses its disk; AQ = 2 with a bookie the fence missed."""
    await _replaced_away(sim, ("b4", "b5"), miss_third=True)


async def bp46_lost_entry(sim: Simulation) -> None:
    """BP-46 scenario 2: a bookie that lost an entry answers an explicit negative for it."""
    sim.set_read_only("b4", True)
    if await sim.open_writer("c1") is None:
        return
    sim.network.hold_adds("c1", "b2")  # B2 never gets e0
    sim.append("c1", 1)
    await sim.until(lambda: sim.acked(0), step_s=0.0001)
    sim.network.clog_node("c1")  # C1 hangs before its explicit LAC leaves
    sim.crash("b1")  # no journal, no flush yet: e0 is gone from B1
    sim.restart("b1")
    await _recover_from(sim, "c2", "b1", ("b3",))
    await sim.finish()


async def zombie_writer(sim: Simulation) -> None:
    """A paused writer wakes up after a takeover fixed the end, and appends again."""
    if await sim.open_writer("c1") is None:
        return
    sim.append("c1", 2)
    await sim.until(lambda: sim.acked(1))
    await asyncio.sleep(0.02)
    sim.network.clog_node("c1")
    await sim.open_writer("c2")
    sim.network.unclog_node("c1")
    sim.append("c1", 1)
    await sim.until(lambda: sim.acked(2), timeout_s=0.3)
    await sim.finish()


async def rewritten_truncate(sim: Simulation) -> None:
    """A recovery starting below an earlier term's no-op writes its TRUNCATE back."""
    sim.set_read_only("b4", True)
    if await sim.open_writer("c1") is None:
        return
    sim.append("c1", 1)
    await sim.until(lambda: sim.acked(0))
    writer = await sim.open_writer("c2")  # term 2: NOOP|TRUNCATE at e1
    if writer is None:
        await sim.finish()
        return
    sim.append("c2", 5)  # e2..e6, on all three bookies (AQ = 3)
    await sim.until(lambda: sim.acked(6))
    await asyncio.sleep(0.05)
    sim.crash("b2", lose_disk=True)  # its LAC and LAFR go with its disk
    sim.restart("b2")
    # EC = E - AQ + 1 = 1: B2's fence answer, first, sets where reading starts (-1).
    await _recover_from(sim, "c3", "b2", ("b1", "b3"))
    await sim.finish()


async def lost_noop(sim: Simulation) -> None:
    """A bookie without the journal loses a truncate no-op that overwrote a dirty entry."""
    sim.set_read_only("b4", True)
    await _dirty_tail(sim, 1)  # B1 holds a dirty e1 (not yet flushed)
    sim.bookies["b1"].flush()  # ... now it is durable on B1
    # C2's recovery never hears B1 (its fence and reads are held): B2 and B3 say the entry
    # after the prefix is absent, and the no-op goes there on all three (the Add stream to B1
    # flows), over B1's dirty entry, in B1's write cache only.
    sim.network.hold_unary("c2", "b1")
    if await sim.open_writer("c2") is None:
        await sim.finish()
        return
    sim.network.release_unary("c2", "b1")
    sim.crash("b1")  # before its next flush: the no-op is lost, its truncation is not
    sim.restart("b1")
    # One reader can only reach B1, another only B2 and B3.
    for other in ("b2", "b3"):
        sim.network.cut("r1", other)
    sim.network.cut("r2", "b1")
    await asyncio.sleep(0.05)
    await sim.read("r1")
    await sim.read("r2")
    await sim.finish()


async def _goes_on(sim: Simulation, name: str, after: str) -> bool:
    """Returns whether client `name`'s writer still gets an append acknowledged; reports a
    liveness violation naming `after` when it does not."""
    client = sim.client(name)
    payload = f"{name}#{client.sequence}".encode()  # what `append` sends next
    if sim.append(name, 1) and await sim.until(
        lambda: any(a.payload == payload for a in sim.checker.acked.values()), timeout_s=1.0
    ):
        return True
    failed = client.writers[-1:]
    error = failed[0].error if failed else "its takeover failed"
    sim.checker.violate(LIVENESS, f"{name}'s writer stopped after {after}: {error!r}")
    return False


async def lost_reply_same_term(sim: Simulation) -> None:
    """The writer's multi-op lands, its reply is lost, a same-term change follows it."""
    changes = itertools.count()

    def operator_change() -> None:  # same term: a new retention policy, nothing else
        sim.admin.set_retention(sim.stream_id, RetentionPolicy(max_age_s=3600.0 + next(changes)))

    def lose(name: str, when: Callable[[], bool]) -> None:
        sim.lose_zk_reply(name, when=when, meanwhile=operator_change)

    sim.set_read_only("b4", True)  # C1's ensemble is B1, B2, B3
    lose("c1", lambda: sim.snapshot()[0].state is StreamState.OPEN)  # its finish_recovery
    await sim.open_writer("c1")
    if not await _goes_on(sim, "c1", "a lost finish_recovery reply"):
        await sim.finish()
        return
    lose("c1", lambda: len(sim.snapshot()[2]) == 2)  # its first capacity roll
    sim.append("c1", sim.config.fragment_max_entries)
    if not await _goes_on(sim, "c1", "a lost roll reply"):
        await sim.finish()
        return
    sim.set_read_only("b4", False)  # the replacement
    crashed = sim.snapshot()[2][-1].ensemble[0]

    def replaced() -> bool:
        return crashed not in sim.snapshot()[2][-1].ensemble

    lose("c1", replaced)  # its ensemble change
    sim.crash(crashed)
    sim.append("c1", 1)  # its add to the crashed bookie fails: the writer replaces it
    await sim.until(replaced, timeout_s=1.0)
    if await _goes_on(sim, "c1", "a lost ensemble change reply") and sim.client("c1").lost_replies:
        # Not a property of the cluster: the script did not do what it is for.
        sim.checker.violate("scenario", "a lost reply the script armed never happened")
    await sim.finish()


async def limbo_stall(sim: Simulation) -> None:
    """AQ journal-less bookies of one write set crash together after a flush (nothing is lost,
    but both come back in limbo): the takeover must fail with `StreamInLimboError` naming
    them, not hang; an accept-loss recovery then ends the previous term after the last entry
    held, phase two clears the limbo, and the final takeover and read see every entry."""
    sim.set_read_only("b4", True)
    if await sim.open_writer("c1") is None:
        return
    sim.append("c1", 5)
    await sim.until(lambda: sim.acked(4))
    await asyncio.sleep(0.05)
    for bookie_id in ("b1", "b2", "b3"):
        sim.bookies[bookie_id].flush()  # everything acknowledged is durable
    sim.network.clog_node("c1")
    for bookie_id in ("b1", "b2"):
        sim.crash(bookie_id)  # a correlated crash (a power cut)
    for bookie_id in ("b1", "b2"):
        sim.restart(bookie_id)
    sim.set_read_only("b4", False)
    if await sim.open_writer("c2") is not None:
        sim.checker.violate(LIVENESS, "a takeover completed through two limbo bookies")
    failed = [line for line in sim.trace.tail() if " takeover_failed c=c2 " in line]
    if not failed or not failed[-1].endswith("error=StreamInLimboError"):
        sim.checker.violate(LIVENESS, f"the stuck takeover did not name limbo: {failed[-1:]}")
    client = sim.client("admin")
    survey = await survey_loss(
        STREAM_NAME,
        transport=client.transport,
        metadata=client.metadata,
        options=sim.writer_options,
    )
    sim.trace.record("survey", limbo=",".join(survey.limbo_bookies), first=survey.first_at_risk)
    if set(survey.limbo_bookies) != {"b1", "b2"}:
        sim.checker.violate(LIVENESS, f"the survey missed the limbo: {survey}")
    try:
        result = await recover_accepting_loss(
            STREAM_NAME,
            transport=client.transport,
            metadata=client.metadata,
            clock=sim.clock,
            rng=client.rng,
            options=sim.writer_options,
            identity=WriterIdentity("admin"),
            operator="sim-operator",
        )
    except StreamError as e:
        sim.checker.violate(LIVENESS, f"the accept-loss recovery failed: {e!r}")
    else:
        sim.trace.record("accept_loss", end=result.last_entry_id, loss=result.accepted_loss)
    await sim.finish()


async def double_failure(sim: Simulation) -> None:
    """Two bookies of the writer's ensemble fail at once (a blip breaks both Add streams): the
    change that replaces the first must not forget the second, whose link it would reopen
    without resending what it missed; nothing fails again, LAFR stays, the window fills and
    the writer hangs with no error (the progress property)."""
    for bookie_id in ("b4", "b5"):
        sim.set_read_only(bookie_id, True)
    if await sim.open_writer("c1") is None:
        return
    ensemble = sim.snapshot()[2][-1].ensemble
    for bookie_id in ("b4", "b5"):
        sim.set_read_only(bookie_id, False)
    sim.append("c1", 20)
    await sim.until(lambda: sim.acked(19))
    sim.append("c1", 10)  # in flight during the blip
    for bookie_id in ensemble[1:]:
        sim.network.cut("c1", bookie_id, 0.005)
    await asyncio.sleep(0.5)
    sim.append("c1", 200)  # more than the window: only a moving LAFR makes room
    await sim.finish()


async def pinned_first(sim: Simulation) -> None:
    """The first failed bookie in ensemble order is pinned (it acked committed entries not yet
    at the whole write set) and another failed bookie is not: the writer must replace that
    one first (which lets LAFR advance and frees the pinned one), not wait on the pinned one
    until it gives up with spares free."""
    for bookie_id in ("b4", "b5"):
        sim.set_read_only(bookie_id, True)
    if await sim.open_writer("c1") is None:
        return
    first, _, last = sim.snapshot()[2][-1].ensemble
    sim.append("c1", 5)
    await sim.until(lambda: sim.acked(4))
    await asyncio.sleep(0.02)
    for bookie_id in ("b4", "b5"):
        sim.set_read_only(bookie_id, False)
    sim.network.hold_adds("c1", last)  # e5..e9 committed by the other two: both pinned
    sim.append("c1", 5)
    await sim.until(lambda: sim.acked(9))
    sim.network.cut("c1", first)  # fails at once, pinned; `last` fails at its add timeout
    sim.append("c1", 5)
    await sim.until(lambda: sim.acked(14), timeout_s=2.0)
    error = sim.client("c1").writers[-1].error
    if error is not None:
        sim.checker.violate(PROGRESS, f"the writer failed with two spares free: {error!r}")
    await sim.finish()


async def replaced_member_returns(sim: Simulation) -> None:
    """A recovery replaces a member locally (the stored fragment still names it), then the
    replacement fails too and the member replaced away is the only spare: picked again, its
    new-member truncation strips the committed entry it holds, and the next recovery reads
    that one explicit "no entry" (AQ = WQ: one is enough) and ends the stream before it."""
    sim.set_read_only("b4", True)  # C1's ensemble is B1, B2, B3
    if await sim.open_writer("c1") is None:
        return
    good = await _good_prefix(sim, "c1", ("b1", "b2", "b3"))
    sim.append("c1", 1)  # acknowledged by all three; its LAC never leaves C1
    await sim.until(lambda: sim.acked(good + 1))
    sim.network.clog_node("c1")
    sim.set_read_only("b4", False)
    for bookie_id in ("b3", "b4"):
        sim.network.hold_adds("c2", bookie_id)  # B3 fails its write-backs: B4 replaces it
    sim.start_takeover("c2")
    # Once B4 took the new-member truncation it fails at once; B3 is the only spare.
    await sim.until(lambda: _term(sim, "b4") == 2)
    await asyncio.sleep(0.005)  # its answer is back
    sim.network.cut("c2", "b4")
    await sim.until(lambda: sim.holds("b3", good + 1) is None, timeout_s=1.0)
    sim.network.clog_node("c2")
    # C3's fence needs one answer (E - AQ + 1): B3's comes first, and so does its read.
    for bookie_id in ("b1", "b2"):
        sim.network.slow("c3", bookie_id, 10 * _SLOW_S)
    await sim.open_writer("c3")
    await sim.finish()


async def roll_boundary_change(sim: Simulation) -> None:
    """A capacity roll waits for LAFR to reach the fragment's end, behind a slow bookie; a
    fast one, which has every entry, fails meanwhile. By the time its ensemble change plans,
    the slow bookie's acks have brought LAFR to the roll's boundary, so the change's fragment
    starts there: the roll then has nothing left to close."""
    sim.set_read_only("b4", True)
    writer = await sim.open_writer("c1")
    if writer is None:
        return
    *fast, slow = sim.snapshot()[2][-1].ensemble
    sim.set_read_only("b4", False)
    sim.network.slow("c1", slow, 0.05)  # its acks come last: they move LAFR
    sim.append("c1", 11)  # ten fill the fragment; the eleventh starts the roll
    await sim.until(lambda: sim.acked(9))
    sim.network.cut("c1", fast[0])
    sim.append("c1", 5)
    await sim.until(lambda: sim.acked(15), timeout_s=2.0)
    if writer.error is not None:
        sim.checker.violate(PROGRESS, f"the writer failed with a spare free: {writer.error!r}")
    await sim.finish()


def _config(**overrides: object) -> SimConfig:
    base: dict[str, object] = {
        "bookies": 4,
        "ensemble": 3,
        "write_quorum": 3,
        "ack_quorum": 2,
        "fragment_max_entries": 100,
        "faults": _quiet_network(),
        "flush_interval_s": 30.0,
    }
    base.update(overrides)
    return SimConfig(**base)  # type: ignore[arg-type]


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "blog-divergence",
            TRUNCATE_NOOP,
            "the unbounded-ledgers blog's log divergence",
            _config(),
            blog_divergence,
        ),
        Scenario(
            "gwq-divergence",
            GWQ,
            "the blog's divergence when the truncate no-op only reaches AQ",
            _config(),
            gwq_divergence,
        ),
        Scenario(
            "design-new-member",
            NEW_MEMBER_TRUNCATION,
            "docs/design.md §5: a dropped bookie rejoins with dirty entries (B1..B5)",
            _config(bookies=5, fragment_max_bytes=1000),
            design_new_member,
        ),
        Scenario(
            "bp46-lost-fence",
            PHASE_ONE_FENCE,
            "BP-46 scenario 1: lost fence status allows writes after the end was fixed",
            _config(bookies=5, ensemble=4, write_quorum=2, ack_quorum=2),
            bp46_lost_fence,
        ),
        Scenario(
            "sealed-lost-fence",
            WIPED_TERM_CHECK,
            "a wiped bookie forgets a SEALED stream's term; the old writer commits after the seal",
            _config(bookies=5, ensemble=4, write_quorum=2, ack_quorum=2),
            sealed_lost_fence,
        ),
        Scenario(
            "unnamed-lost-fence",
            WIPED_TERM_CHECK,
            "a wiped bookie that a recovery replaced away forgets the term (E=WQ=2, AQ=1)",
            _config(bookies=3, ensemble=2, write_quorum=2, ack_quorum=1),
            unnamed_lost_fence,
        ),
        Scenario(
            "unnamed-lost-fence-aq2",
            WIPED_TERM_CHECK,
            "a wiped bookie that a recovery replaced away forgets the term (E=WQ=3, AQ=2)",
            _config(bookies=5, ensemble=3, write_quorum=3, ack_quorum=2),
            unnamed_lost_fence_aq2,
        ),
        Scenario(
            "bp46-lost-entry",
            LIMBO,
            "BP-46 scenario 2: recovery truncates a previously acknowledged entry",
            _config(journal_less=frozenset({"b1"})),
            bp46_lost_entry,
        ),
        Scenario(
            "zombie-writer",
            TERM_FENCING,
            "a paused writer appends after a takeover fixed the end",
            _config(),
            zombie_writer,
        ),
        Scenario(
            "lost-noop",
            None,
            "a bookie without the journal loses a truncate no-op; the dirty entry it had "
            "replaced comes back",
            _config(journal_less=frozenset({"b1"})),
            lost_noop,
        ),
        Scenario(
            "limbo-stall",
            None,
            "two journal-less bookies of a write set crash together: the takeover fails "
            "naming limbo, an accept-loss recovery ends the stall",
            _config(journal_less=frozenset({"b1", "b2"})),
            limbo_stall,
        ),
        Scenario(
            "rewritten-truncate",
            None,
            "a recovery writes an earlier term's NOOP|TRUNCATE back over committed entries",
            _config(ack_quorum=3),
            rewritten_truncate,
        ),
        Scenario(
            "lost-reply-same-term",
            None,
            "the writer's metadata change lands, its reply is lost and a same-term change "
            "follows before it looks again",
            _config(fragment_max_entries=10),
            lost_reply_same_term,
        ),
        Scenario(
            "double-failure",
            KEEP_FAILED,
            "two bookies of the ensemble fail at once; the second is never replaced",
            _config(bookies=5),
            double_failure,
        ),
        Scenario(
            "replaced-member-returns",
            SPARE_HOLDERS,
            "a member replaced away by a recovery comes back as its replacement's replacement",
            _config(ack_quorum=3),
            replaced_member_returns,
        ),
        Scenario(
            "roll-boundary-change",
            None,
            "an ensemble change lands on the boundary a capacity roll is closing",
            _config(fragment_max_entries=10),
            roll_boundary_change,
        ),
        Scenario(
            "pinned-first",
            UNPINNED_FIRST,
            "the first failed bookie is pinned; an unpinned one could be replaced first",
            _config(bookies=5),
            pinned_first,
        ),
    )
}


def run_scenario(name: str, seed: int, disabled: Iterable[str] = ()) -> RunResult:
    """Returns the result of directed scenario `name` under `seed` (latencies and placement
    draws), with the protections in `disabled` off."""
    scenario = SCENARIOS[name]
    off = check_disabled(disabled)
    config = SimConfig(**{**scenario.config.__dict__, "disabled": off})
    return run_simulation(seed, config, scenario.script, steps=0, scenario=name)
