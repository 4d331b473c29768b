"""The REAL background services in the simulation (`stream.sim.services`): retention trimming
while a writer appends, the auditor and a replication worker re-replicating after bookies are
lost, judged by the simulator's checker and deterministic for a seed; and a retention that
ignores the durable cursors is caught."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from stream.metadata.model import RetentionPolicy
from stream.sim.cluster import SimConfig, Simulation
from stream.sim.runner import RunResult, run_simulation
from stream.sim.services import RETENTION_HOLDS, RETENTION_NODE, SimServices

# Writer "a"'s clock runs about 100 s behind the cluster's (`CLOCK_SKEW_MS`): what it writes is
# past a 1 s age limit at once, so the cursor alone decides what retention may drop.
LAGGING_WRITER = "a"
KEEP_UNCONSUMED = RetentionPolicy(max_age_s=1.0, keep_unconsumed=True)


def _run(seed: int, script: Callable[[Simulation], Awaitable[None]]) -> RunResult:
    async def whole(sim: Simulation) -> None:
        await script(sim)
        await sim.finish()

    return run_simulation(seed, SimConfig(), whole, steps=0, scenario="services")


@dataclass
class _RetentionRun:
    result: RunResult
    services: SimServices
    # How many trims had landed when the leader's session was expired.
    trims_before_expiry: int


def _retention_run(seed: int, unsafe: frozenset[str] = frozenset()) -> _RetentionRun:
    seen: list[SimServices] = []
    trims_before_expiry: list[int] = []

    async def script(sim: Simulation) -> None:
        services = await sim.start_services(retention_policy=KEEP_UNCONSUMED, unsafe=unsafe)
        seen.append(services)
        await sim.open_writer(LAGGING_WRITER)
        for step in range(40):
            sim.append(LAGGING_WRITER, 4)
            await asyncio.sleep(0.25)
            if step % 4 == 3 and sim.checker.acked:
                # The consumer stays a little behind the writer.
                await services.consume(max(sim.checker.acked) - 15)
            if step == 20:
                # The leader loses its session: it steps down, and leads again on a new one.
                trims_before_expiry.append(len(services.trims))
                services.expire_session(RETENTION_NODE, 0.5)

    result = _run(seed, script)
    return _RetentionRun(result, seen[0], trims_before_expiry[0])


def test_retention_trims_old_fragments_while_a_writer_appends() -> None:
    run = _retention_run(3)
    assert run.result.ok, run.result.violations
    assert len(run.services.trims) >= 3, run.services.trims  # trimmed round after round
    assert len(run.services.trims) > run.trims_before_expiry  # and after the session loss
    assert run.result.acknowledged >= 100
    assert _retention_run(3).result.trace_digest == run.result.trace_digest


def test_retention_that_ignores_the_cursors_is_caught() -> None:
    result = _retention_run(3, frozenset({"ignore-cursors"})).result
    assert not result.ok
    assert {v.property for v in result.violations} == {RETENTION_HOLDS}


# Writer "k" of the second stream lags about as much (about 98 s).
OTHER_STREAM, OTHER_WRITER = "sim2", "k"


def _two_stream_run(seed: int, unsafe: frozenset[str]) -> tuple[RunResult, SimServices]:
    """Retention with `KEEP_UNCONSUMED` on two streams, a lagging writer on each; the
    consumer keeps up with the first stream and stays 15 entries behind on the second."""
    seen: list[SimServices] = []

    async def script(sim: Simulation) -> None:
        other = sim.add_stream(OTHER_STREAM)
        sim.client(OTHER_WRITER, OTHER_STREAM)
        services = await sim.start_services(retention_policy=KEEP_UNCONSUMED, unsafe=unsafe)
        seen.append(services)
        await sim.open_writer(LAGGING_WRITER)
        await sim.open_writer(OTHER_WRITER)
        for _ in range(30):
            sim.append(LAGGING_WRITER, 4)
            sim.append(OTHER_WRITER, 4)
            await asyncio.sleep(0.25)
            if sim.checker.acked:
                await services.consume(max(sim.checker.acked))
            if other.checker.acked:
                await services.consume(max(other.checker.acked) - 15, other)

    return _run(seed, script), seen[0]


def test_retention_is_judged_on_every_stream() -> None:
    result, services = _two_stream_run(3, frozenset())
    assert result.ok, result.violations
    assert len(services.trims_of[OTHER_STREAM]) >= 2, services.trims_of
    result, _ = _two_stream_run(3, frozenset({"ignore-cursors"}))
    others = [v for v in result.violations if v.details.startswith(f"stream {OTHER_STREAM}:")]
    assert {v.property for v in others} == {RETENTION_HOLDS}, result.violations


def _named(sim: Simulation, bookie_id: str) -> bool:
    return any(bookie_id in f.ensemble for f in sim.snapshot()[2])


def _rereplication_run(seed: int, seen: list[SimServices]) -> RunResult:
    async def script(sim: Simulation) -> None:
        services = await sim.start_services()
        seen.append(services)
        await sim.open_writer("w")
        for _ in range(2):
            # Lose, for good, a bookie of the oldest fragment: the auditor marks its closed
            # fragments, a worker copies them; the writer replaces it in the open one.
            victim = sim.snapshot()[2][0].ensemble[0]
            sim.append("w", 30)
            await sim.until(lambda: len(sim.checker.acked) >= 30, 10.0)
            sim.crash(victim, lose_disk=True)
            sim.append("w", 10)
            assert await sim.until(lambda v=victim: not _named(sim, v), 30.0, 0.05), victim

    return _run(seed, script)


def test_auditor_and_worker_rereplicate_after_bookies_are_lost() -> None:
    seen: list[SimServices] = []
    result = _rereplication_run(5, seen)
    assert result.ok, result.violations
    workers = seen[0].autorecovery.workers
    assert sum(w.outcomes.get("replicated", 0) for w in workers) >= 2
    assert seen[0].autorecovery.audits >= 1
    again = _rereplication_run(5, [])
    assert again.trace_digest == result.trace_digest


def test_fault_schedulers_run_one_retention_round_or_audit_at_a_time() -> None:
    seen: list[SimServices] = []

    async def script(sim: Simulation) -> None:
        services = await sim.start_services(
            retention_policy=RetentionPolicy(max_age_s=1.0), periodic=False
        )
        seen.append(services)
        await sim.open_writer(LAGGING_WRITER)
        sim.append(LAGGING_WRITER, 40)
        await sim.until(lambda: len(sim.checker.acked) >= 40, 10.0)
        await sim.run_retention_once()
        assert services.trims, "one round trims what the policy drops"
        victim = sim.snapshot()[2][-1].ensemble[0]
        sim.crash(victim, lose_disk=True)
        sim.append(LAGGING_WRITER, 10)

        async def audited() -> bool:
            await sim.run_audit_once()
            return not _named(sim, victim)

        deadline = sim.loop.time() + 30.0
        while not await audited():
            assert sim.loop.time() < deadline, f"{victim} still named"
            await asyncio.sleep(0.25)

    result = _run(11, script)
    assert result.ok, result.violations
    assert seen[0].retention.rounds == 1
    assert seen[0].autorecovery.audits == 0  # no auditor of its own: the actions audited
    assert sum(w.outcomes.get("replicated", 0) for w in seen[0].autorecovery.workers) >= 1
