"""The background services inside a simulation: the REAL retention service, auditor, replication
workers and scrub (`stream.retention.service`, `stream.autorecovery`), each on a node of the
simulated network with its own session on the simulated ZooKeeper, on the virtual clock.

- Bookie traffic goes through `SimTransport` (latency, cuts, clogs and crashes apply); the
  metadata port's calls cross the network to the "zk" node as the clients' do.
- The services' own blocking ZooKeeper calls (`asyncio.to_thread` in production) run at once
  on the loop's thread (`InlineExecutor`): a real thread would let virtual time run ahead of
  them, and the schedule would no longer follow from the seed.
- Their leader elections (`LeaderElection`) run on the simulated ZooKeeper; kazoo's watch
  recipes (the auditor's bookie and marker watches) run on `FakeKazooClient`.
- `start()` runs the replication workers, and, when `periodic`, the retention service and the
  auditor on their own schedules (`serve()`, their production loops, elections included); the
  actions `run_retention_once()` and `run_audit_once()` run one pass now, for fault
  schedulers.

What the checker cannot know, services add: entries retention trimmed legitimately are not
lost (they leave the checker's acknowledged set when the services stop), and a trim past the
lowest durable cursor of a `keep_unconsumed` policy is a violation of `RETENTION_HOLDS`, judged
on every stream of the run from the metadata writes themselves (the policy they carry, not the
service's own plan).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from stream.autorecovery.auditor import Auditor, AuditReport
from stream.autorecovery.service import AutoRecovery
from stream.autorecovery.settings import AutoRecoverySettings
from stream.clock import LoopClock
from stream.logs import get_logger
from stream.metadata import paths
from stream.metadata.cursors import CursorStore
from stream.metadata.model import RetentionPolicy, StreamMeta
from stream.retention.service import RetentionService, RetentionSettings, RoundReport
from stream.sim.network import SimTransport
from stream.sim.zookeeper import FakeKazooClient, SimMetadata, SimMetadataSession

if TYPE_CHECKING:
    from stream.sim.cluster import SimStream, Simulation

log = get_logger(__name__)

T = TypeVar("T")

# The property a trim past what the durable cursors hold violates.
RETENTION_HOLDS = "retention-holds"
RETENTION_NODE = "retention"
AUTORECOVERY_NODE = "autorecovery"
CURSOR = "sim-consumer"


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """An executor that runs each call at once on the caller's thread (a ThreadPoolExecutor
    only because asyncio accepts no other as a loop's default)."""

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # delivered to the awaiting coroutine, as a thread's would be
            future.set_exception(e)
        return future


def fast_retention_settings() -> RetentionSettings:
    """Returns retention settings scaled to the simulated network."""
    return RetentionSettings(
        interval_s=0.5,
        takeover_retry_s=2.0,
        bookie_timeout_s=0.3,
        takeover_deadline_s=3.0,
    )


def fast_autorecovery_settings() -> AutoRecoverySettings:
    """Returns auto-recovery settings scaled to the simulated network."""
    return AutoRecoverySettings(
        lost_bookie_recovery_delay_ms=500,
        open_stream_replication_delay_ms=1_000,
        audit_interval_ms=1_000,
        scrub_interval_ms=2_000,
        scrub_full_interval_ms=4_000,
        replication_workers=1,
        bookie_timeout_ms=300,
    )


@dataclass(frozen=True)
class ServiceNode:
    """One service process: a node on the network with its ZooKeeper session, metadata port,
    bookie transport, clock and random source."""

    name: str
    session: SimMetadataSession
    metadata: SimMetadata
    transport: SimTransport
    clock: LoopClock
    rng: random.Random

    @classmethod
    def on(cls, sim: Simulation, name: str) -> ServiceNode:
        session = SimMetadataSession(FakeKazooClient(sim.zk, now=sim.loop.time))
        return cls(
            name,
            session,
            SimMetadata(sim.network, name, session),
            SimTransport(sim.network, name),
            LoopClock(sim.network.now_ms),
            random.Random(sim.rng.getrandbits(64)),
        )


class CursorBlindRetention(RetentionService):
    """A retention service that ignores the durable cursors (`keep_unconsumed` plans as if no
    cursor held anything): the unsafe switch that shows the simulation finds such a bug."""

    async def _cursor_positions(self, stream_id: int) -> list[int]:
        return []


class SimServices:
    """The background services of one `Simulation` (build and start it inside the loop)."""

    def __init__(
        self,
        sim: Simulation,
        *,
        retention_policy: RetentionPolicy | None = None,
        retention: RetentionSettings | None = None,
        autorecovery: AutoRecoverySettings | None = None,
        periodic: bool = True,
        unsafe: frozenset[str] = frozenset(),
    ) -> None:
        """`unsafe` may name `ignore-cursors` (retention trims what cursors hold)."""
        self.sim = sim
        self.retention_policy = retention_policy
        self.periodic = periodic
        self.retention_node = ServiceNode.on(sim, RETENTION_NODE)
        self.autorecovery_node = ServiceNode.on(sim, AUTORECOVERY_NODE)
        retention_class = CursorBlindRetention if "ignore-cursors" in unsafe else RetentionService
        node = self.retention_node
        self.retention = retention_class(
            node.session,  # type: ignore[arg-type]
            retention or fast_retention_settings(),
            identifier=RETENTION_NODE,
            clock=node.clock,
            rng=node.rng,
            writer_options=sim.writer_options,
            transport_factory=lambda _: SimTransport(sim.network, RETENTION_NODE),
            metadata=node.metadata,
        )
        node = self.autorecovery_node
        self.autorecovery_settings = autorecovery or fast_autorecovery_settings()
        self.autorecovery = AutoRecovery(
            node.session,  # type: ignore[arg-type]
            self.autorecovery_settings,
            identifier=AUTORECOVERY_NODE,
            auditor=periodic,
            clock=node.clock,
            rng=random.Random(node.rng.getrandbits(64)),
            metadata=node.metadata,
            transport=node.transport,
        )
        # The one-pass auditor (its missing-bookie clocks carry over between passes).
        self.auditor = Auditor(
            metadata=node.metadata,
            transport=node.transport,
            settings=self.autorecovery_settings,
            identifier=f"{AUTORECOVERY_NODE}-once",
            rng=random.Random(node.rng.getrandbits(64)),
            clock=node.clock,
        )
        self._cursors = CursorStore(
            self.retention_node.session,  # type: ignore[arg-type]
            clock_ms=sim.network.now_ms,
        )
        # Per stream id: the highest first retained entry its metadata named.
        self._first_retained: dict[int, int] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        # Per stream name: every move of its first retained entry, in order.
        self.trims_of: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ lifecycle

    @property
    def trims(self) -> list[int]:
        """Returns the first stream's trims (every move of its first retained entry)."""
        return self.trims_of.setdefault(next(iter(self.sim.streams)), [])

    async def start(self) -> None:
        """Sets the retention policy on every stream and runs the services (when
        `periodic`)."""
        sim = self.sim
        sim.zk.on_write.append(self._on_zk_write)
        for stream in sim.streams.values():
            if not sim.deleted(stream):
                self.apply_policy(stream)
        # The workers always run (markers wake them); the auditor and retention run on their
        # own schedule only when periodic, otherwise when the actions say.
        self._tasks = [sim.spawn(self.autorecovery.serve())]
        if self.periodic:
            self._tasks.append(sim.spawn(self.retention.serve()))
        sim.trace.record("services_started", periodic=int(self.periodic))

    async def stop(self) -> None:
        """Stops the services. (What retention trimmed is gone by the policy, not lost: the
        checker knows the stream's first retained entry.)"""
        self.retention.stop()
        self.autorecovery.stop()
        for task in self._tasks:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), 5.0)
            task.cancel()
        self.retention.close()
        first = self.sim.first_retained_entry()
        self.sim.trace.record("services_stopped", first_retained=first)

    def apply_policy(self, stream: SimStream) -> None:
        """Sets the run's retention policy (if any) on `stream` (a stream created after
        `start` too), with the simulated consumer's cursor at -1: it has read nothing yet,
        so a keep_unconsumed policy holds everything until `consume` moves it."""
        if self.retention_policy is not None:
            self.sim.admin.set_retention(stream.id, self.retention_policy)
            self._cursors.commit(stream.id, CURSOR, -1)

    # ------------------------------------------------------------------ actions

    async def run_retention_once(self) -> RoundReport:
        """Runs one retention round now (no election), as `streamctl retention run --once`."""
        report = await self.retention.run_once_async()
        self.sim.trace.record(
            "retention_round", deleted=report.fragments_deleted, errors=report.errors
        )
        return report

    async def run_audit_once(self) -> AuditReport:
        """Runs one audit pass now (no election); the workers take the markers it leaves."""
        report = await self.auditor.audit()
        self.sim.trace.record("audit", marked=report.marked, takeovers=report.takeovers)
        for worker in self.autorecovery.workers:
            worker.wake_up()
        return report

    async def consume(self, entry_id: int, stream: SimStream | None = None) -> None:
        """Moves the simulated consumer's durable cursor on `stream` (default the first) to
        `entry_id` (never back)."""
        stream_id = self.sim.stream_id if stream is None else stream.id
        current = self._cursors.get(stream_id, CURSOR)
        if current is not None and current[0].entry_id >= entry_id:
            return
        self._cursors.commit(stream_id, CURSOR, entry_id)
        self.sim.trace.record("consumed", s=stream_id, e=entry_id)

    def expire_session(self, node: str, reconnect_after_s: float) -> None:
        """Expires the ZooKeeper session of service `node` (`RETENTION_NODE` or
        `AUTORECOVERY_NODE`); it gets a new one `reconnect_after_s` later and contends again."""
        nodes = {RETENTION_NODE: self.retention_node, AUTORECOVERY_NODE: self.autorecovery_node}
        self.sim.faults += 1
        self.sim.trace.record("expire", c=node)
        nodes[node].session.zk.expire(reconnect_after_s)

    # ------------------------------------------------------------------ the oracle

    def _on_zk_write(self, path: str, data: bytes) -> None:
        """Judges every move of a stream's first retained entry as it lands, on every stream
        of the run: under a `keep_unconsumed` policy with no size bound (the one its metadata
        carries), nothing the cursor has not consumed may go."""
        stream = next(
            (s for s in self.sim.streams.values() if path == paths.stream_meta(s.id)), None
        )
        if stream is None:
            return
        meta = StreamMeta.from_json(data)
        first = meta.first_entry_id
        if first <= self._first_retained.get(stream.id, 0):
            return
        self._first_retained[stream.id] = first
        self.trims_of.setdefault(stream.name, []).append(first)
        self.sim.trace.record("trimmed", s=stream.id, first=first)
        policy = meta.retention
        if policy is None or not policy.keep_unconsumed or policy.max_bytes is not None:
            return
        found = self._cursors.get(stream.id, CURSOR)
        position = -1 if found is None else found[0].entry_id
        if first > position + 1:
            stream.checker.violate(
                RETENTION_HOLDS,
                f"the first retained entry moved to {first}, past what the durable cursor "
                f"{CURSOR!r} consumed ({position}) under a keep_unconsumed policy",
            )
