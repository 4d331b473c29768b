"""The shipping bookie inside the simulator: the real request handling (`BookieCore`), the real
storage engine (journal group commit, write cache, entry logs, index, replay) over a simulated
disk (`SimDisk`), and the real BP-46 phase one and two (`stream.bookie.integrity`), all on the
simulator's virtual-time loop. Nothing of the bookie is re-implemented here: this module only
boots it, schedules its background jobs (the storage calls `on_work`), and maps the
simulator's protections onto the bookie's test-only switches (`stream.bookie.unsafe`).

A process crash abandons the storage and crashes the disk (what was not synced is lost, a
torn journal tail may stay); a lost disk wipes it, and the next start is a cookie fix (phase
one, the forgotten-terms bound). Metadata is read through the simulator's real `StreamStore`
over the fake ZooKeeper (phase one, the term and trim checks), and phase two's `Repairer`
reads its peers and runs its takeovers through this node's own simulated transport. The real
reconciler (`stream.bookie.reconcile`) trims what metadata no longer retains, on virtual time.

A journal group commit is written at once and synced `journal_sync_s` (seeded) later, the next
group forming meanwhile; an armed power cut (`arm_power_cut`) stops a job at a sync and crashes
the bookie there. What the bookie answered OK for is checked at each start (`AnsweredAdds`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import zlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from stream.autorecovery.phase_two import Repairer
from stream.bookie.config import BookieConfig
from stream.bookie.core import BookieCore, StartReport
from stream.bookie.disk import DiskStatus
from stream.bookie.integrity import begin_phase_one, limbo_bounds, phase_one_reason
from stream.bookie.reconcile import MetadataReconciler, ReconcileReport
from stream.bookie.storage import StreamStateView, StreamStorage
from stream.bookie.storage.scanned import AddRequest, parse_add
from stream.bookie.terms import MetadataTerms, StreamFacts, metadata_terms_for
from stream.bookie.unsafe import UnsafeSkips
from stream.client.options import WriterOptions
from stream.client.ports import answered_codes
from stream.client.recovery import WriterIdentity
from stream.clock import Clock
from stream.errors import StreamNotFoundError
from stream.logs import get_logger
from stream.metadata.model import Fragment, StreamMeta
from stream.sim.acknowledged import BOOKIE_DURABILITY, AnsweredAdds
from stream.sim.answered_terms import BOOKIE_TERMS, AnsweredTerms
from stream.sim.disk import DiskFault, SimDisk
from stream.sim.trace import Trace
from stream.sim.zookeeper import FakeKazooClient, SimMetadataSession
from stream.wire import bookie_pb2 as pb

log = get_logger(__name__)

T = TypeVar("T")
R = TypeVar("R")

_WRITABLE = DiskStatus(False, 1 << 30, 1 << 31, "/sim", 0.5)
_FULL = DiskStatus(True, 0, 1 << 31, "/sim", 1.0)


@dataclass(frozen=True, slots=True)
class BookieProtections:
    """The bookie-side protections the simulator may switch off (each maps onto the real
    bookie's test-only switches, `stream.bookie.unsafe`).

    - `enforce_terms`: the term rule; off, every term-bearing request is served whatever its
      term ("no fence": `term_check`).
    - `phase_one_fence`: after an unclean start, raise each named stream's term to the
      metadata term (`phase_one_term`).
    - `limbo`: after an unclean start, mark each named non-sealed stream limbo (`limbo`).
    - `wiped_term_check`: after a disk loss, learn the term of a stream the bookie holds no
      state for from metadata before serving a term-bearing request for it.
    - `extra`: further switches by their bookie names (tests that break a rule inside the
      bookie, e.g. `limbo_unknown`).
    """

    enforce_terms: bool = True
    phase_one_fence: bool = True
    limbo: bool = True
    wiped_term_check: bool = True
    extra: frozenset[str] = frozenset()

    def unsafe(self) -> UnsafeSkips:
        names = set(self.extra)
        for on, switch in (
            (self.enforce_terms, "term_check"),
            (self.phase_one_fence, "phase_one_term"),
            (self.limbo, "limbo"),
            (self.wiped_term_check, "wiped_term_check"),
        ):
            if not on:
                names.add(switch)
        return UnsafeSkips(frozenset(names))


# What phase one reads of the metadata, and the snapshot the metadata checks read.
StreamsWithBookie = Callable[[str], list[tuple[StreamMeta, list[Fragment]]]]
Snapshot = Callable[[int], tuple[StreamMeta, int, list[Fragment]]]


class SimBookie:
    """One bookie of the simulation: the shipping code over a simulated disk. Requests return
    a future of their response (answered once durable, as the real bookie answers)."""

    def __init__(
        self,
        bookie_id: str,
        *,
        trace: Trace,
        journal_write_data: bool = True,
        protections: BookieProtections = BookieProtections(),
        repair_interval_s: float = 0.05,
        rng: random.Random | None = None,
        write_cache_max_bytes: int | None = None,
        flush_delay_s: float = 0.0,
        journal_sync_s: float = 0.0,
    ) -> None:
        """`write_cache_max_bytes` replaces the bookie's default write cache, and a flush the
        storage wants starts `flush_delay_s` late (a slow disk): a small cache that stays full
        meanwhile answers adds TOO_BUSY. `journal_sync_s` is the journal fdatasync's typical
        virtual duration (each sync takes between half and one and a half of it, seeded):
        records appended meanwhile form the next group, and appends are acknowledged that much
        after they were written. 0: a group is written and synced at once."""
        self._flush_delay_s = flush_delay_s
        self.bookie_id = bookie_id
        self.journal_write_data = journal_write_data
        self.protections = protections
        self._trace = trace
        # Phase two starts this long after the bookie serves (the real one starts once its
        # server is up; a takeover right at the restart instant is the clients' first).
        self._repair_delay_s = repair_interval_s
        self._rng = rng or random.Random(zlib.crc32(bookie_id.encode()))
        # How the bookie's Add answers name their entries: as ranges (the data port's version
        # 2, the writers' default) or every id (gRPC, version 1): told by the id (b1, b4, b5
        # and b7 ranged; b2, b3 and b6 not), not drawn, so that seeds keep their runs.
        self.ranged_answers = zlib.crc32(bookie_id.encode()) % 5 < 3
        self._unsafe = protections.unsafe()
        self.disk = SimDisk(random.Random(self._rng.getrandbits(64)))
        self._journal_sync_s = journal_sync_s
        # Derived from the bookie's random state without drawing from it: a run whose syncs
        # take no time keeps every other draw of the bookie (phase two's) as it was.
        self._sync_rng = random.Random(hash(self._rng.getstate()[1]))
        # The journal group written and being synced (its fdatasync ends then).
        self._sync_handle: asyncio.TimerHandle | None = None
        # Set by the simulator while a power cut is armed on this disk: the crash to run
        # when it hits (at a sync, in the middle of a job).
        self.on_power_cut: Callable[[], None] | None = None
        self.config = BookieConfig(
            bookie_id=bookie_id,
            listen=f"{bookie_id}:3181",
            metadata="sim:2181/streamkeeper",
            data_dir=f"/sim/{bookie_id}",
            journal_write_data=journal_write_data,
            # The simulator flushes (`flush`); GC and compaction run at their due times then.
            flush_interval_ms=3_600_000,
            gc_interval_ms=500,
            compaction_interval_ms=1_000,
            major_compaction_interval_ms=5_000,
            journal_max_group_wait_ms=0.0,
        )
        if write_cache_max_bytes is not None:
            self.config = replace(self.config, write_cache_max_bytes=write_cache_max_bytes)
        self.up = False
        self.incarnation = 0
        # Set by the simulator: metadata views, and phase two's own network node.
        self.streams_with_bookie: StreamsWithBookie | None = None
        self.snapshot: Snapshot | None = None
        self.peer_entry: Any = None  # unused: phase two reads peers over the network
        self.next_stream_id: Callable[[], int] | None = None
        self.repair_transport: Any = None
        self.repair_metadata: Any = None
        self.repair_clock: Any = None
        self.writer_options: WriterOptions | None = None
        # Set by the simulator: the bookie's current metadata session (a new one after each
        # restart or expiry) and the clock its reconciler runs on.
        self.metadata_session: Callable[[], SimMetadataSession] | None = None
        self.clock: Clock | None = None
        self.reconcile_rounds = 0
        self.power_cuts = 0
        # What this bookie answered OK for, judged at each start (a journaled bookie loses
        # none of it in a crash); violations go to `on_violation(property, details)`.
        self.answered = AnsweredAdds()
        # The terms it served, judged at each start too, journal or not.
        self.answered_terms = AnsweredTerms()
        self.on_violation: Callable[[str, str], None] | None = None
        # On the disk, in the index directory (lost with it): the journal-bypass marker and
        # the stream id below which terms may have been forgotten.
        self._journal_bypassed = False
        self.forgotten_below = 0
        self._cookie_fix = False
        self._storage: StreamStorage | None = None
        self._core: BookieCore | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._jobs_armed = False
        self._fault: DiskFault | None = None
        # The storage engine failed (a write hit the full disk): like the real one, it answers
        # INTERNAL until the process restarts.
        self.storage_failed = False
        self._boot()

    # ------------------------------------------------------------------ lifecycle

    def _boot(self) -> None:
        """Opens the storage (replay), runs phase one when needed and makes it durable (the
        journal job, at once), then serves: all in one virtual instant, as a restart is."""
        loop = asyncio.get_running_loop()
        self.storage_failed = False
        journal_bypassed_before = self._journal_bypassed
        if not self.journal_write_data:
            self._journal_bypassed = True
        storage = StreamStorage(
            self.config, disk=self.disk, clock=loop.time, threads=False, unsafe=self._unsafe
        )
        storage.on_work = self._arm_jobs
        report = storage.open()
        self._storage = storage
        self._check_answered(storage)
        self._check_terms(storage)
        reason = phase_one_reason(
            unclean=bool(report.unclean),
            journal_bypassed=journal_bypassed_before,
            cookie_fix=self._cookie_fix,
        )
        if reason is not None and self.streams_with_bookie is not None:
            streams = self.streams_with_bookie(self.bookie_id)
            futures, _, _ = begin_phase_one(storage, streams, unsafe=self._unsafe)
            storage.commit_journal()
            for future in futures:
                future.result(timeout=0)  # durable before serving (or the boot fails)
            self._trace.record("phase1", b=self.bookie_id, why=reason, n=len(streams))
        if self._cookie_fix:
            self._cookie_fix = False
            if self.next_stream_id is not None:
                self.forgotten_below = max(self.forgotten_below, self.next_stream_id())
        if self.journal_write_data:
            self._journal_bypassed = False
        self._core = BookieCore(
            self.config,
            storage,
            instance_id=f"{self.bookie_id}-{self.incarnation}",
            start_report=StartReport(bool(report.unclean), 0, 0),
            disk_status=_WRITABLE if self._fault is None else _FULL,
            metadata_terms=None if self.snapshot is None else self._metadata_terms(storage),
        )
        self.up = True
        self.incarnation += 1
        self._trace.record("start", b=self.bookie_id, unclean=int(report.unclean))
        bounds = limbo_bounds(storage)
        if bounds and self.repair_transport is not None:
            self._spawn(self._repair(storage, bounds))
        self._spawn(self._reconcile(storage))

    async def _reconcile(self, storage: StreamStorage) -> None:
        """Runs the bookie's reconciler, as the process does once it serves: now, then every
        GC interval (from the first loop turn: the simulator wires the metadata session after
        the first boot)."""
        if self.metadata_session is None:
            return
        reconciler = MetadataReconciler(
            storage,
            _CurrentSession(self.metadata_session),  # type: ignore[arg-type]
            interval_s=self.config.gc_interval_ms / 1000,
            clock=self.clock,
            on_round=self._reconciled,
        )
        await reconciler.run_forever()

    def _reconciled(self, report: ReconcileReport) -> None:
        self.reconcile_rounds += 1
        if report.streams_trimmed or report.streams_deleted:
            self._trace.record(
                "reconciled",
                b=self.bookie_id,
                trimmed=report.streams_trimmed,
                deleted=report.streams_deleted,
            )

    def _check_answered(self, storage: StreamStorage) -> None:
        """Reports the entries this journaled bookie answered OK for and lost (replay must
        bring back every one, wherever the crash landed)."""
        if not self.journal_write_data or self.on_violation is None:
            return

        def first_retained(stream_id: int) -> int:
            state = storage.stream_state(stream_id)
            return 0 if state is None else state.first_entry_id

        def held(stream_id: int, entry_id: int) -> bool:
            return storage.read(stream_id, entry_id).code == pb.OK

        missing = self.answered.missing(first_retained, held)
        if missing:
            self.on_violation(
                BOOKIE_DURABILITY,
                f"{self.bookie_id} lost {len(missing)} entries it acknowledged "
                f"(stream, entry): {missing[:5]}",
            )
            self.answered.forget()  # reported once

    def _check_terms(self, storage: StreamStorage) -> None:
        """Reports the terms this bookie served and forgot (replay must bring back every one,
        journal or not, wherever the crash landed)."""
        if self.on_violation is None:
            return

        def term_of(stream_id: int) -> int | None:
            state = storage.stream_state(stream_id)
            return None if state is None else state.term

        forgotten = self.answered_terms.forgotten(term_of)
        if forgotten:
            self.on_violation(
                BOOKIE_TERMS,
                f"{self.bookie_id} (journal_write_data={self.journal_write_data}) forgot terms "
                f"it served (stream, served, replayed): {forgotten[:5]}",
            )
            self.answered_terms.forget()  # reported once

    async def _repair(self, storage: StreamStorage, bounds: dict[int, int]) -> None:
        repairer = Repairer(
            bookie_id=self.bookie_id,
            storage=storage,
            write_cache_max_bytes=storage.config.write_cache_max_bytes,
            metadata=self.repair_metadata,
            transport=self.repair_transport,
            options=self.writer_options,
            rng=random.Random(self._rng.getrandbits(64)),
            clock=self.repair_clock,
            identity=WriterIdentity(f"bookie-repair-{self.bookie_id}", "sim", 1),
        )
        await asyncio.sleep(self._repair_delay_s)
        results = await repairer.run(bounds)
        for stream_id, result in sorted(results.items()):
            self._trace.record("phase2", b=self.bookie_id, s=stream_id, how=result.outcome)

    def _metadata_terms(self, storage: StreamStorage) -> MetadataTerms:
        return metadata_terms_for(
            storage, self._read_facts, forgotten_below=self.forgotten_below, unsafe=self._unsafe
        )

    async def _read_facts(self, stream_id: int) -> StreamFacts | None:
        assert self.snapshot is not None
        try:
            meta, _, _ = self.snapshot(stream_id)
        except StreamNotFoundError:
            return None
        return StreamFacts(meta.term, meta.first_entry_id)

    def _down(self, event: str, **fields: object) -> None:
        self.up = False
        self.incarnation += 1
        self._core = None
        self.on_power_cut = None
        if self._sync_handle is not None:
            self._sync_handle.cancel()
            self._sync_handle = None
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()
        self._trace.record(event, b=self.bookie_id, **fields)

    def crash(self, *, lose_disk: bool = False) -> None:
        """Stops the bookie abruptly: the disk keeps what was synced (nothing with
        `lose_disk`: it is replaced, and the next start fixes the cookie)."""
        self._down("crash", disk=int(lose_disk))
        if self._storage is not None:
            self._storage.abandon()
            self._storage = None
        if lose_disk or not self.journal_write_data:
            self.answered.forget()
        if lose_disk:
            self.answered_terms.forget()
            self.disk.wipe()
            self._journal_bypassed = False
            self.forgotten_below = 0
            self._cookie_fix = True
        else:
            self.disk.crash()

    def stop_cleanly(self) -> None:
        """Stops the bookie after a final flush (no phase one at the next start)."""
        self.disk.cut_power_at_sync(None)  # an orderly stop outruns an armed power cut
        self._down("stop")
        if self._storage is not None:
            with contextlib.suppress(Exception):
                self._storage.close()
            self._storage = None

    def start(self) -> None:
        """Starts the bookie: replay, then phase one (when needed) before it serves, and
        phase two in the background."""
        if self._storage is None:
            self._boot()

    def set_disk_fault(self, kind: DiskFault | None) -> None:
        """Puts a fault on the bookie's disk: "full" (writes fail with ENOSPC, and the disk
        checker turns the bookie read-only), "read_only" (the disk checker's verdict) or
        None (healed)."""
        self.disk.set_fault(kind)
        self._fault = kind
        if self._core is not None:
            self._core.set_disk_status(_WRITABLE if kind is None else _FULL)
        self._trace.record("disk", b=self.bookie_id, fault=kind or "-")

    # ------------------------------------------------------------------ background jobs

    def arm_power_cut(self, syncs: int, crash: Callable[[], None]) -> None:
        """Cuts the power at this bookie's disk after `syncs` more syncs succeed: the job
        that reaches the next one stops there (its writes since its last sync are not
        durable) and `crash` runs as that job returns (the simulator's crash of this bookie).
        """
        self.disk.cut_power_at_sync(syncs)
        self.on_power_cut = crash
        self._trace.record("power_cut_armed", b=self.bookie_id, syncs=syncs)

    def disarm_power_cut(self) -> None:
        """Drops an armed power cut that has not hit yet."""
        if self.on_power_cut is not None and not self.disk.power_cut:
            self.disk.cut_power_at_sync(None)
            self.on_power_cut = None

    def _after_job(self) -> None:
        """Crashes the bookie if the job that just ran hit the armed power cut."""
        crash = self.on_power_cut
        if crash is not None and self.disk.power_cut:
            self.on_power_cut = None
            self.power_cuts += 1
            self._trace.record("power_cut", b=self.bookie_id)
            crash()

    def _arm_jobs(self) -> None:
        if not self._jobs_armed:
            self._jobs_armed = True
            asyncio.get_running_loop().call_soon(self._run_jobs, self._storage)

    def _run_jobs(self, storage: StreamStorage | None) -> None:
        """The journal thread's and the flusher's steps: the pending journal records are
        written as one group (synced at once, or `journal_sync_s` later while the next group
        forms), and a flush runs when one was asked for."""
        self._jobs_armed = False
        if storage is None or storage is not self._storage:
            return
        try:
            if not self._journal_sync_s:
                storage.commit_journal()
            elif self._sync_handle is None and storage.write_journal():
                duration_s = self._journal_sync_s * self._sync_rng.uniform(0.5, 1.5)
                self._sync_handle = asyncio.get_running_loop().call_later(
                    duration_s, self._journal_synced, storage
                )
            if storage.flush_wanted() and not self.disk.power_cut:
                if self._flush_delay_s > 0:
                    loop = asyncio.get_running_loop()
                    loop.call_later(self._flush_delay_s, self._run_flush, storage)
                else:
                    storage.run_flush_once()
        except Exception as e:
            self._job_failed(e)
        self._after_job()

    def _run_flush(self, storage: StreamStorage) -> None:
        """A flush started late (`flush_delay_s`), unless the bookie restarted meanwhile."""
        if storage is self._storage and not self.disk.power_cut:
            try:
                storage.run_flush_once()
            except Exception as e:
                self._job_failed(e)
            self._after_job()

    def _job_failed(self, error: Exception) -> None:
        """The disk failed: the storage answers INTERNAL from now on."""
        self.storage_failed = True
        log.debug("sim.bookie.job_failed", bookie=self.bookie_id, error=repr(error))

    def _journal_synced(self, storage: StreamStorage) -> None:
        """The fdatasync of the written group ends: it is acknowledged, and the records that
        arrived meanwhile are the next group."""
        self._sync_handle = None
        if storage is not self._storage:
            return
        storage.sync_journal()
        if self.disk.power_cut:
            self._after_job()
        else:
            self._run_jobs(storage)

    def flush(self) -> None:
        """Runs the flusher's step (and GC when due), as the periodic flush does."""
        storage = self._storage
        if storage is None or not self.up:
            return
        try:
            storage.run_flush_once()
            if asyncio.get_running_loop().time() >= storage.next_gc_due():
                storage.run_gc_due()
        except Exception as e:
            self.storage_failed = True
            log.debug("sim.bookie.flush_failed", bookie=self.bookie_id, error=repr(e))
        self._after_job()

    # ------------------------------------------------------------------ requests

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _serve(
        self,
        kind: str,
        call: Callable[[BookieCore], Coroutine[Any, Any, R]],
        *,
        served: tuple[int, int] | None = None,
        **fields: object,
    ) -> asyncio.Task[R]:
        """Runs `call` on the serving core; `served` is the `(stream_id, term)` of a
        term-bearing request (its OK answer is noted in `answered_terms`)."""
        core = self._core
        if core is None:
            raise ConnectionRefusedError(f"{self.bookie_id} is not serving")
        task: asyncio.Task[R] = self._spawn(call(core))
        task.add_done_callback(lambda t: self._traced(kind, t, fields))
        if served is not None and served[1] > 0:
            task.add_done_callback(lambda t: self._served(t, *served))
        return task

    def _served(self, task: asyncio.Task[Any], stream_id: int, term: int) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        response = task.result()
        codes = response.codes if hasattr(response, "codes") else [response.code]
        if pb.OK in codes:
            self.answered_terms.on_served(stream_id, term)

    def _traced(self, kind: str, task: asyncio.Task[Any], fields: dict[str, object]) -> None:
        if task.cancelled() or task.exception() is not None:
            code: object = "-"
        else:
            response = task.result()
            code = list(response.codes) if kind == "add" else response.code
            if code == pb.INTERNAL or (isinstance(code, list) and pb.INTERNAL in code):
                # The core answers INTERNAL only when the storage or its journal failed.
                self.storage_failed = True
        self._trace.record(kind, b=self.bookie_id, code=code, **fields)

    def add(
        self, request: pb.AddRequest, raw: bytes | None = None
    ) -> asyncio.Future[pb.AddResponse]:
        """Serves one Add batch; `raw`, the batch as sent, is served as the gRPC service serves
        it (`parse_add`: scanned where it can be), else `request` is."""
        ids = [e.entry_id for e in request.entries]
        batch = request if raw is None else parse_add(raw, self.config.max_entry_bytes)
        task = self._serve(
            "add",
            lambda core: _add(core, batch, raw, self.ranged_answers),
            served=(request.stream_id, request.term),
            t=request.term,
            ids=ids,
        )
        if self.journal_write_data:
            arrival = self.answered.add_arrived(request)
            task.add_done_callback(
                lambda t: (
                    None
                    if t.cancelled() or t.exception() is not None
                    else self.answered.on_add(request, answered_codes(t.result()), arrival)
                )
            )
        return task

    def fence(self, request: pb.FenceRequest) -> asyncio.Future[pb.FenceResponse]:
        return self._serve(
            "fence",
            lambda core: core.fence(request),
            served=(request.stream_id, request.term),
            t=request.term,
        )

    def read(self, request: pb.ReadRequest) -> asyncio.Future[pb.ReadResponse]:
        return self._serve(
            "read",
            lambda core: core.read(request),
            served=(request.stream_id, request.term),
            e=request.entry_id,
            t=request.term,
        )

    def read_lac(self, request: pb.ReadLacRequest) -> asyncio.Future[pb.ReadLacResponse]:
        return self._serve("read_lac", lambda core: core.read_lac(request))

    def truncate(self, request: pb.TruncateRequest) -> asyncio.Future[pb.TruncateResponse]:
        task = self._serve(
            "truncate",
            lambda core: core.truncate(request),
            served=(request.stream_id, request.term),
            t=request.term,
            after=request.after_entry_id,
        )
        self.answered.truncate_arrived(request.stream_id, request.after_entry_id)
        return task

    def trim(self, request: pb.TrimRequest) -> asyncio.Future[pb.TrimResponse]:
        return self._serve("trim", lambda core: core.trim(request), before=request.before_entry_id)

    def stream_state(
        self, request: pb.StreamStateRequest
    ) -> asyncio.Future[pb.StreamStateResponse]:
        return self._serve("state", lambda core: core.stream_state(request))

    def read_range(self, request: pb.ReadRangeRequest) -> list[pb.ReadRangeResponse]:
        """Returns the ReadRange responses (entries in batches; the last carries the code
        that ended the range)."""
        core = self._core
        if core is None:
            raise ConnectionRefusedError(f"{self.bookie_id} is not serving")
        responses = []
        for head, entries in core.read_range(request):
            assert isinstance(entries, list)  # parsed, as raw=False gives them
            head.entries.extend(entries)
            responses.append(head)
        return responses

    @property
    def streams(self) -> _StreamStates:
        """The storage's stream states by id (`.get(stream_id)`: term, limbo, lac, lafr...),
        for scripts that wait for a bookie to know something."""
        return _StreamStates(self._storage)

    def held(self, stream_id: int, entry_id: int) -> pb.Entry | None:
        """Returns the entry this bookie would serve now (None when down or absent)."""
        storage = self._storage
        if not self.up or storage is None:
            return None
        outcome = storage.read(stream_id, entry_id)
        return outcome.entry if outcome.code == pb.OK else None


async def _add(
    core: BookieCore, batch: AddRequest, raw: bytes | None, ranged: bool
) -> pb.AddResponse:
    """Serves one Add batch as gRPC's `Add` (`ranged` False) or a data port of version 2 does."""
    return await core.finish_add(await core.start_add(batch, raw), ranged=ranged)


class _CurrentSession:
    """The bookie's metadata session as the reconciler sees it: the real process keeps one
    session that reconnects; the simulator gives the bookie a new one at each restart and
    after an expiry, so this reads whichever is current."""

    def __init__(self, current: Callable[[], SimMetadataSession]) -> None:
        self._current = current

    @property
    def zk(self) -> FakeKazooClient:
        return self._current().zk

    def retry(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._current().retry(func, *args, **kwargs)


class _StreamStates:
    """A read-only view of a storage's stream states (none while the bookie is down)."""

    def __init__(self, storage: StreamStorage | None) -> None:
        self._storage = storage

    def get(self, stream_id: int) -> StreamStateView | None:
        return None if self._storage is None else self._storage.stream_state(stream_id)
