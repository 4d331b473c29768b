"""Auto-recovery as a service: an auditor candidate and replication workers on one metadata
session, in a bookie process (`autorecovery = true`) or standalone (`streamctl autorecovery
run`). Every instance contends for `/auditor/leader` (kazoo's Lock recipe); the leader audits
when a bookie's delay ends, when the set of lost or draining bookies changes, when an open
fragment's grace ends, and every `audit_interval_ms`; it also runs the scrub. Workers run in
every instance, leader or not."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import threading
import uuid

from stream.autorecovery import metrics
from stream.autorecovery.auditor import Auditor
from stream.autorecovery.scrub import Scrubber
from stream.autorecovery.settings import AutoRecoverySettings
from stream.autorecovery.worker import ReplicationWorker
from stream.client.grpc_transport import GrpcTransport
from stream.client.ports import BookieTransport
from stream.client.zk_metadata import ZkMetadata
from stream.clock import Clock, SystemClock
from stream.logs import get_logger
from stream.metadata import MetadataSession, paths
from stream.metadata.bookies import BookieRegistry
from stream.metadata.election import ELECTION_BACKOFF_S, LeaderElection
from stream.metadata.underreplication import UnderreplicationStore
from stream.security.tls import TLSConfig
from stream.wakeup import wake

log = get_logger(__name__)


class AutoRecovery:
    """Auditor candidate plus `settings.replication_workers` workers on `session` (not
    owned). `run()` blocks until `stop()`; `start()` runs it on a daemon thread."""

    def __init__(
        self,
        session: MetadataSession,
        settings: AutoRecoverySettings | None = None,
        *,
        identifier: str | None = None,
        auditor: bool = True,
        tls: TLSConfig | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        metadata: ZkMetadata | None = None,
        transport: BookieTransport | None = None,
    ) -> None:
        """`tls`: reach the bookies over TLS with these files (None: plaintext). `metadata`
        and `transport` are the metadata port on `session` and the bookie transport (default:
        a `ZkMetadata` and gRPC, built on the service's loop; the service closes them)."""
        self._tls = tls
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._metadata = metadata
        self._transport = transport
        self.settings = settings or AutoRecoverySettings()
        self.identifier = identifier or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        self._session = session
        self._with_auditor = auditor
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None  # the leading auditor's
        self._stopped: asyncio.Event | None = None
        self._election: LeaderElection | None = None
        self._thread: threading.Thread | None = None
        self.workers: list[ReplicationWorker] = []
        self.leading = False
        self.audits = 0

    # -- lifecycle -------------------------------------------------------------------------

    def run(self) -> None:
        asyncio.run(self.serve())

    def start(self) -> threading.Thread:
        """Runs the service on a daemon thread (its own event loop: copies and audits stay
        off the caller's loop)."""
        self._thread = threading.Thread(target=self.run, name="autorecovery", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stops the auditor and the workers (a copy in progress is abandoned: its lock goes,
        the marker stays). Thread-safe."""
        self._stopping = True
        election = self._election
        if election is not None:
            election.cancel()
        for worker in self.workers:
            worker.stop()
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopped.set)
        self._wake_up()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _wake_up(self) -> None:
        wake(self._loop, self._wake)

    async def serve(self) -> None:
        """`run()` on the running event loop: returns after `stop()`."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        if self._stopping:
            return
        metadata = self._metadata or ZkMetadata(self._session)
        # Copies are read from the bookies' data ports where they have one and the cluster is
        # plaintext (a third less CPU per entry on both ends than gRPC's ReadRange; over TLS,
        # gRPC's costs less, see StreamClient); they are written over gRPC.
        transport = self._transport or GrpcTransport(
            metadata.bookie_address,
            tls=self._tls,
            resolve_data=metadata.bookie_data_address,
            data_adds=False,
            data_reads=self._tls is None,
        )
        self.workers = [
            ReplicationWorker(
                metadata=metadata,
                transport=transport,
                settings=self.settings,
                identifier=f"{self.identifier}/w{i}",
                clock=self._clock,
                rng=random.Random(self._rng.getrandbits(64)),
            )
            for i in range(self.settings.replication_workers)
        ]
        store = UnderreplicationStore(self._session)
        watch = None
        if self.workers:
            watch = await asyncio.to_thread(store.watch_markers, lambda _: self._wake_workers())
        log.info(
            "autorecovery.started",
            id=self.identifier,
            workers=len(self.workers),
            auditor=self._with_auditor,
        )
        tasks = [asyncio.create_task(w.run()) for w in self.workers]
        if self._with_auditor:
            tasks.append(asyncio.create_task(self._contend(metadata, transport)))
        try:
            await self._stopped.wait()
        finally:
            if watch is not None:
                watch.stop()
            for worker in self.workers:
                worker.stop()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            # The port has no close: only the gRPC transport holds channels to release.
            if isinstance(transport, GrpcTransport):
                with contextlib.suppress(Exception):
                    await transport.close()
            metadata.close()
            log.info("autorecovery.stopped", id=self.identifier)

    def _wake_workers(self) -> None:
        for worker in self.workers:
            worker.wake_up()

    # -- the auditor's election --------------------------------------------------------------

    async def _contend(self, metadata: ZkMetadata, transport: BookieTransport) -> None:
        election = LeaderElection(
            self._session,
            paths.AUDITOR_ELECTION,
            self.identifier,
            events="autorecovery",
            rng=random.Random(self._rng.getrandbits(64)),
            on_change=self._wake_up,
        )
        self._election = election
        try:
            while not self._stopping:
                if not await election.campaign():
                    continue
                self.leading = True
                metrics.AUDITOR_LEADING.set(1)
                log.info("autorecovery.auditor_elected", id=self.identifier)
                try:
                    await self._lead(metadata, transport, election)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("autorecovery.auditor_failed")
                    await self._clock.sleep(ELECTION_BACKOFF_S)
                finally:
                    self.leading = False
                    metrics.AUDITOR_LEADING.set(0)
                    await election.resign()
        finally:
            election.close()

    async def _lead(
        self, metadata: ZkMetadata, transport: BookieTransport, election: LeaderElection
    ) -> None:
        settings = self.settings
        auditor = Auditor(
            metadata=metadata,
            transport=transport,
            settings=settings,
            identifier=self.identifier,
            rng=random.Random(self._rng.getrandbits(64)),
            clock=self._clock,
        )
        scrubber = Scrubber(
            metadata=metadata,
            transport=transport,
            timeout_s=settings.bookie_timeout_ms / 1000,
            clock=self._clock,
        )
        registry = BookieRegistry(self._session)
        watch = await asyncio.to_thread(registry.watch_available, lambda _: self._wake_up())
        store = UnderreplicationStore(self._session)
        drain_watch = await asyncio.to_thread(store.watch_draining, lambda _: self._wake_up())

        now = self._clock.monotonic()
        next_audit = now
        next_scrub = now + settings.scrub_interval_ms / 1000
        full_s = settings.scrub_full_interval_ms / 1000
        next_full = now + full_s if full_s else float("inf")
        last_bad: dict[str, str] | None = None
        try:
            while not self._stopping and await election.holds():
                assert self._wake is not None
                self._wake.clear()
                bad = await auditor.bad_bookies()
                now = self._clock.monotonic()
                deadline = auditor.next_deadline()
                if (
                    now >= next_audit
                    or bad != last_bad
                    or (deadline is not None and deadline <= now)
                ):
                    report = await auditor.audit(lambda: not self._stopping)
                    self.audits += 1
                    last_bad = report.bad
                    next_audit = self._clock.monotonic() + settings.audit_interval_ms / 1000
                now = self._clock.monotonic()
                if now >= next_scrub:
                    full = now >= next_full
                    await scrubber.scrub(full=full, may_continue=lambda: not self._stopping)
                    next_scrub = self._clock.monotonic() + settings.scrub_interval_ms / 1000
                    if full:
                        next_full = self._clock.monotonic() + full_s
                deadline = auditor.next_deadline()
                wake_at = min(
                    next_audit, next_scrub, deadline if deadline is not None else next_audit
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._wake.wait(), max(wake_at - self._clock.monotonic(), 0.05)
                    )
        finally:
            watch.stop()
            drain_watch.stop()
