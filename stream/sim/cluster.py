"""One simulated cluster on a virtual-time loop: bookies, the network, ZooKeeper, clients
running the REAL writer, recovery and reader (`stream.client`), and the checker watching them.

The random runner (`stream.sim.runner`) and the directed scripts (`stream.sim.scenarios`) both
drive a `Simulation` through its actions (take over, append, read, crash, pause, cut, clog,
expire a session...), then `finish()`: every fault healed, a last takeover fixes the end, a
last reader reads the whole stream, and the checker judges.

Every random choice comes from one `random.Random(seed)`: each component gets its own
`random.Random` drawn from it, in a fixed order.
"""

from __future__ import annotations

import asyncio
import functools
import random
import zlib
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from stream.bookie.unsafe import UNSAFE_SWITCHES
from stream.client.options import Protections, ReaderOptions, WriterOptions
from stream.client.reader import AsyncStreamReader
from stream.client.recovery import WriterIdentity
from stream.client.seal import seal
from stream.client.writer import AsyncStreamWriter
from stream.clock import LoopClock
from stream.errors import NotEnoughBookiesError, StreamError
from stream.logs import get_logger
from stream.metadata import paths
from stream.metadata.bookies import BookieRegistration, BookieRegistry
from stream.metadata.model import Fragment, StreamMeta, StreamState
from stream.metadata.streams import StreamStore
from stream.protocol import EntryFlag, fragment_index_for, journal_required
from stream.sim.bookie import BookieProtections, SimBookie
from stream.sim.checker import LIVENESS, PROGRESS, Checker, Violation, write_quorum_gap
from stream.sim.disk import DiskFault
from stream.sim.give_up import GiveUp, PinWatch
from stream.sim.loop import close_when_done
from stream.sim.network import NetworkFaults, SimClock, SimNetwork, SimTransport, SkewedClock
from stream.sim.services import InlineExecutor, SimServices
from stream.sim.trace import Trace
from stream.sim.zookeeper import (
    FakeKazooClient,
    FakeZooKeeper,
    SimMetadata,
    SimMetadataSession,
)

log = get_logger(__name__)

T = TypeVar("T")

STREAM_NAME = "sim"

# The protections that can be switched off, by their CLI names.
TERM_FENCING = "term-fencing"
TRUNCATE_NOOP = "truncate-noop"
NEW_MEMBER_TRUNCATION = "new-member-truncation"
GWQ = "gwq"
PHASE_ONE_FENCE = "phase-one-fence"
LIMBO = "limbo"
WIPED_TERM_CHECK = "wiped-term-check"
SPARE_HOLDERS = "spare-holders"
# Two that keep the writer live (the progress property finds their counterexamples).
KEEP_FAILED = "keep-failed"
UNPINNED_FIRST = "unpinned-first"
PROTECTIONS = (
    TERM_FENCING,
    TRUNCATE_NOOP,
    NEW_MEMBER_TRUNCATION,
    GWQ,
    PHASE_ONE_FENCE,
    LIMBO,
    WIPED_TERM_CHECK,
    SPARE_HOLDERS,
    KEEP_FAILED,
    UNPINNED_FIRST,
)

# Virtual seconds a writer has, once every fault healed, to resolve each append it took
# (acknowledged, or failed with an error): far above the writer's own timeouts and deadlines
# (`fast_writer_options`), so that only a stall is judged.
PROGRESS_S = 5.0
# Clients' wall clocks are off by up to this much, each its own way.
CLOCK_SKEW_MS = 120_000

# A property the checker reports when the real client raised something it never should (a bug
# outside the four safety properties).
CLIENT_ERROR = "client-error"


def client_protections(disabled: Iterable[str]) -> Protections:
    """Returns the client's protections with those named in `disabled` off. `term-fencing` off
    also stops the recovery's Fence (it asks StreamState instead)."""
    off = set(disabled)
    return Protections(
        term_fencing=TERM_FENCING not in off,
        truncate_noop=TRUNCATE_NOOP not in off,
        new_member_truncation=NEW_MEMBER_TRUNCATION not in off,
        recovery_write_quorum=GWQ not in off,
        spare_holders=SPARE_HOLDERS not in off,
        keep_failed_bookies=KEEP_FAILED not in off,
        replace_unpinned_first=UNPINNED_FIRST not in off,
    )


def bookie_protections(disabled: Iterable[str]) -> BookieProtections:
    """Returns the bookies' protections with those named in `disabled` off. `term-fencing` off
    makes bookies serve every term: with the client's recovery reads and writes carrying the
    term, skipping the Fence alone still fences entry by entry, so "no fence" is the bookie
    ignoring terms, as BookKeeper without fencing."""
    off = set(disabled)
    return BookieProtections(
        enforce_terms=TERM_FENCING not in off,
        phase_one_fence=PHASE_ONE_FENCE not in off,
        limbo=LIMBO not in off,
        wiped_term_check=WIPED_TERM_CHECK not in off,
        # The bookie's own test-only switches, by their names (tests that break a rule
        # inside the shipping bookie).
        extra=frozenset(off & UNSAFE_SWITCHES),
    )


def fast_writer_options(protections: Protections) -> WriterOptions:
    """Returns writer options scaled to the simulated network (milliseconds of latency)."""
    return WriterOptions(
        window_entries=64,
        batch_max_entries=16,
        inflight_batches_per_bookie=4,
        # Every batch pipelined at once (no waiting for a full one): the most batches in flight
        # and the most interleavings for the checker.
        pipelined_batch_min_entries=1,
        add_timeout_s=0.25,
        explicit_lac_delay_s=0.002,
        fence_timeout_s=0.1,
        recovery_read_timeout_s=0.1,
        truncate_timeout_s=0.1,
        recovery_read_ahead=4,
        retry_backoff_s=0.01,
        retry_backoff_max_s=0.2,
        takeover_deadline_s=3.0,
        ensemble_change_deadline_s=0.5,
        protections=protections,
    )


def fast_reader_options() -> ReaderOptions:
    """Returns reader options scaled to the simulated network."""
    return ReaderOptions(
        speculative_timeout_s=0.02,
        read_timeout_s=0.3,
        read_ahead=8,
        range_max_entries=64,
        lac_poll_ms=100,
        retry_backoff_s=0.02,
    )


@dataclass(frozen=True)
class SimConfig:
    """The shape of one simulated cluster and stream."""

    bookies: int = 5
    ensemble: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    fragment_max_entries: int = 10
    fragment_max_bytes: int = 1 << 20
    # Bookies running without journal_write_data (entries durable only at a flush).
    journal_less: frozenset[str] = frozenset()
    flush_interval_s: float = 0.1
    # The bookies' write cache (None: the bookie's default); a small one answers TOO_BUSY.
    write_cache_max_bytes: int | None = None
    # A flush the storage wants starts this late (a slow disk; see `SimBookie`).
    flush_delay_s: float = 0.0
    faults: NetworkFaults = field(default_factory=NetworkFaults)
    disabled: frozenset[str] = frozenset()
    # The journal fdatasync's typical virtual duration (0: a group commit takes no time).
    journal_sync_s: float = 0.0

    def bookie_ids(self) -> list[str]:
        return [f"b{i}" for i in range(1, self.bookies + 1)]


@dataclass
class SimStream:
    """One stream of the simulation and the checker judging it (the properties hold per
    stream)."""

    name: str
    id: int
    checker: Checker


class SimClient:
    """One client process: a node on the network with its transport, its own ZooKeeper
    session and metadata port, and the writers it opened (the last one is current)."""

    def __init__(self, sim: Simulation, name: str, stream: str = STREAM_NAME) -> None:
        self.name = name
        self.sim = sim
        # The stream this client writes and reads, and its incarnation then (None before the
        # stream exists): the one that judges what the client gets.
        self.stream = stream
        self.incarnation = sim.streams.get(stream)
        self.rng = random.Random(sim.rng.getrandbits(64))
        self.transport = SimTransport(sim.network, name)
        self.zk = FakeKazooClient(sim.zk, now=sim.loop.time, lose_reply=self._lose_reply)
        self.session = SimMetadataSession(self.zk)
        self.metadata = SimMetadata(sim.network, name, self.session)
        # Each client's wall clock is off by its own amount: timestamps must not go backwards
        # when writers take over from one another (checker property 5).
        offset_ms = zlib.crc32(name.encode()) % (2 * CLOCK_SKEW_MS + 1) - CLOCK_SKEW_MS
        self.clock = SkewedClock(sim.clock, offset_ms)
        self.writers: list[AsyncStreamWriter] = []
        self.opening: asyncio.Task[Any] | None = None
        self.sequence = 0
        self.replies_to_lose = 0
        # Directed lost replies: (when, meanwhile), see `Simulation.lose_zk_reply`.
        self.lost_replies: list[tuple[Callable[[], bool], Callable[[], object] | None]] = []

    @property
    def writer(self) -> AsyncStreamWriter | None:
        """Returns the writer opened last, if it is still usable."""
        if not self.writers:
            return None
        writer = self.writers[-1]
        return None if writer.error is not None else writer

    def _lose_reply(self, kind: str) -> bool:
        if kind != "multi":
            return False
        if self.replies_to_lose > 0:
            self.replies_to_lose -= 1
            self._lost()
            return True
        for armed in self.lost_replies:
            when, meanwhile = armed
            if when():
                self.lost_replies.remove(armed)
                self._lost()
                if meanwhile is not None:
                    meanwhile()
                return True
        return False

    def _lost(self) -> None:
        self.sim.trace.record("zk_reply_lost", c=self.name)
        if self.replies_to_lose == 0 and not self.lost_replies:
            self.sim.history.end("lost_reply", self.name)


class Simulation:
    """A simulated cluster on the running virtual-time loop (build it inside the loop)."""

    def __init__(self, seed: int, config: SimConfig) -> None:
        self.seed = seed
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.rng = random.Random(seed)
        self.trace = Trace(self.loop.time)
        self.network = SimNetwork(
            self.loop, random.Random(self.rng.getrandbits(64)), self.trace, config.faults
        )
        self.history = self.network.history
        self.clock = SimClock(self.network)
        self.zk = FakeZooKeeper(clock_ms=self.network.now_ms, schedule=self.loop.call_soon)
        # Blocking metadata calls that production runs in a thread (the bookies' reconcilers,
        # the services) run at once on the loop's thread: a real thread would let virtual
        # time run ahead of them, and the schedule would no longer follow from the seed.
        self.loop.set_default_executor(InlineExecutor())
        self.checker = Checker(self.trace, self.loop.time)
        self.zk.on_write.append(self._on_zk_write)
        self.disabled = frozenset(config.disabled)
        self.writer_options = fast_writer_options(client_protections(self.disabled))
        self.reader_options = fast_reader_options()
        self._admin_session = SimMetadataSession(FakeKazooClient(self.zk, now=self.loop.time))
        self.admin = StreamStore(
            self._admin_session,  # type: ignore[arg-type]  # the session's duck type
            clock_ms=self.network.now_ms,
        )
        self.bookies: dict[str, SimBookie] = {}
        self.read_only: set[str] = set()
        self.disk_faults: set[str] = set()
        # Appends each writer took and has neither acknowledged nor failed (progress).
        self._unresolved: Counter[AsyncStreamWriter] = Counter()
        # Each writer's failed and pinned members, sampled at every check (needless give-up).
        self.pins = PinWatch()
        self._bookie_sessions: dict[str, SimMetadataSession] = {}
        bookie_rng = random.Random(self.rng.getrandbits(64))
        for bookie_id in config.bookie_ids():
            bookie = SimBookie(
                bookie_id,
                trace=self.trace,
                journal_write_data=bookie_id not in config.journal_less,
                protections=bookie_protections(self.disabled),
                rng=random.Random(bookie_rng.getrandbits(64)),
                write_cache_max_bytes=config.write_cache_max_bytes,
                flush_delay_s=config.flush_delay_s,
                journal_sync_s=config.journal_sync_s,
            )
            bookie.streams_with_bookie = self.admin.streams_with_bookie
            bookie.snapshot = self.admin.get_snapshot
            bookie.peer_entry = self._peer_entry
            bookie.next_stream_id = self._next_stream_id
            # Phase two's own node: it reads peers and takes over as a client would.
            bookie.repair_transport = SimTransport(self.network, bookie_id)
            repair_session = SimMetadataSession(FakeKazooClient(self.zk, now=self.loop.time))
            bookie.repair_metadata = SimMetadata(self.network, bookie_id, repair_session)
            bookie.repair_clock = self.clock
            bookie.writer_options = self.writer_options
            bookie.metadata_session = functools.partial(self._bookie_session, bookie_id)
            bookie.clock = LoopClock(self.network.now_ms)
            bookie.on_violation = self.checker.violate
            self.bookies[bookie_id] = bookie
            self.network.bookies[bookie_id] = bookie
        self._flush_rng = bookie_rng
        self.clients: dict[str, SimClient] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.faults = 0
        self.stream_id = 0
        self.lossy_crashes = 0
        # Bookies that lost data they may have acknowledged (the loss budget: fewer than AQ).
        self.lossy_bookies: set[str] = set()
        self._restarts: dict[str, asyncio.TimerHandle] = {}
        # Bookies whose restart waits for their full disk to heal.
        self._blocked_restarts: set[str] = set()
        self.finished = False
        self._snapshots: dict[int, tuple[StreamMeta, int, list[Fragment]]] = {}
        # Every stream by name (the first is `STREAM_NAME`, judged by `checker`).
        self.streams: dict[str, SimStream] = {}
        # Deletes and trims still running: `finish` waits for them.
        self.stream_ops: set[asyncio.Task[Any]] = set()
        # The real background services, once `start_services` ran them.
        self.services: SimServices | None = None

    # ------------------------------------------------------------------ setup

    async def start(self) -> None:
        """Creates the layout and the stream, registers the bookies, starts their flushes."""
        for path in paths.BASE_LAYOUT:
            self._admin_session.zk.ensure_path(path)
        self._admin_session.zk.create(paths.STREAMS_NEXT_ID, b"1")
        for bookie_id in self.bookies:
            self._register(bookie_id)
            self._arm_flush(bookie_id)
        meta = self.admin.create_stream(
            STREAM_NAME,
            self.config.ensemble,
            self.config.write_quorum,
            self.config.ack_quorum,
            self.config.fragment_max_entries,
            self.config.fragment_max_bytes,
        )
        self.stream_id = meta.id
        self.streams[STREAM_NAME] = SimStream(STREAM_NAME, meta.id, self.checker)
        self.trace.record(
            "start",
            seed=self.seed,
            e=self.config.ensemble,
            wq=self.config.write_quorum,
            aq=self.config.ack_quorum,
            fme=self.config.fragment_max_entries,
            jl=",".join(sorted(self.config.journal_less)),
            off=",".join(sorted(self.disabled)),
        )

    def add_stream(self, name: str) -> SimStream:
        """Creates another stream of the cluster's shape, judged by its own checker."""
        meta = self.admin.create_stream(
            name,
            self.config.ensemble,
            self.config.write_quorum,
            self.config.ack_quorum,
            self.config.fragment_max_entries,
            self.config.fragment_max_bytes,
        )
        checker = Checker(self.trace, self.loop.time, stream=name)
        stream = self.streams[name] = SimStream(name, meta.id, checker)
        self.trace.record("stream", name=name, s=meta.id)
        return stream

    def violations(self) -> list[Violation]:
        """Returns every stream's violations (the first stream's first)."""
        return [v for stream in self.streams.values() for v in stream.checker.violations]

    def acknowledged(self) -> int:
        """Returns how many acknowledgments the application got, on every stream."""
        return sum(stream.checker.ack_count for stream in self.streams.values())

    def deleted(self, stream: SimStream) -> bool:
        """Returns whether `stream` was deleted (its metadata is gone)."""
        return self.zk.exists(paths.stream_meta(stream.id)) is None

    def _register(self, bookie_id: str) -> None:
        self.history.end("unregistered", bookie_id)
        session = SimMetadataSession(FakeKazooClient(self.zk, now=self.loop.time))
        self._bookie_sessions[bookie_id] = session
        BookieRegistry(session).register(  # type: ignore[arg-type]
            bookie_id, self._registration(bookie_id, bookie_id in self.read_only)
        )

    def _registration(self, bookie_id: str, read_only: bool) -> BookieRegistration:
        journal = bookie_id not in self.config.journal_less
        return BookieRegistration(
            f"{bookie_id}:3181", read_only=read_only, journal_write_data=journal
        )

    def set_read_only(self, bookie_id: str, read_only: bool) -> None:
        """Publishes `bookie_id` as read-only (placement skips it) or writable again."""
        session = self._bookie_sessions[bookie_id]
        path = paths.bookie_available(bookie_id)
        data = self._registration(bookie_id, read_only).to_json()
        (self.read_only.add if read_only else self.read_only.discard)(bookie_id)
        if read_only:
            self.history.start("read_only", bookie_id)
        else:
            self.history.end("read_only", bookie_id)
        # A bookie that is down publishes its state when it registers again.
        if not session.zk.closed and session.zk.exists(path) is not None:
            session.zk.set(path, data)
        self.trace.record("read_only", b=bookie_id, ro=int(read_only))

    def set_disk_fault(
        self, bookie_id: str, kind: DiskFault | None, duration_s: float | None = None
    ) -> None:
        """Puts `bookie_id`'s disk in fault `kind` ("read_only", "full"; None: healthy) for
        `duration_s` (None: until called again): it refuses adds and truncations and
        publishes itself read-only, as the real bookie does."""
        if kind is not None:
            self.faults += 1
            self.disk_faults.add(bookie_id)
        else:
            self.disk_faults.discard(bookie_id)
        self.bookies[bookie_id].set_disk_fault(kind)
        self.set_read_only(bookie_id, kind is not None)
        if kind is not None and duration_s is not None:
            self.loop.call_later(duration_s, self._heal_disk, bookie_id)

    def _heal_disk(self, bookie_id: str) -> None:
        if bookie_id in self.disk_faults:
            self.set_disk_fault(bookie_id, None)
            self.restart_if_failed(bookie_id)
            if bookie_id in self._blocked_restarts:
                self._blocked_restarts.discard(bookie_id)
                self.restart(bookie_id)

    def restart_if_failed(self, bookie_id: str) -> None:
        """Restarts `bookie_id` if its storage failed on the full disk: the real storage engine
        answers INTERNAL from then on, until its process is restarted (what its operator does
        once the disk has room again)."""
        bookie = self.bookies[bookie_id]
        if bookie.up and bookie.storage_failed:
            self.trace.record("restart_failed", b=bookie_id)
            self.crash(bookie_id, downtime_s=self.rng.uniform(0.01, 0.1))

    def _arm_flush(self, bookie_id: str) -> None:
        interval = self.config.flush_interval_s * self._flush_rng.uniform(0.5, 1.5)
        self.loop.call_later(interval, self._flush, bookie_id)

    def _flush(self, bookie_id: str) -> None:
        bookie = self.bookies[bookie_id]
        if bookie.up:
            bookie.flush()
            if bookie_id not in self.disk_faults:
                self.restart_if_failed(bookie_id)  # it failed just before the disk healed
        if not self.finished:
            self._arm_flush(bookie_id)

    def _bookie_session(self, bookie_id: str) -> SimMetadataSession:
        return self._bookie_sessions[bookie_id]

    def _next_stream_id(self) -> int:
        data, _ = self._admin_session.zk.get(paths.STREAMS_NEXT_ID)
        return int(data)

    def _peer_entry(self, bookie_id: str, stream_id: int, entry_id: int) -> Any:
        bookie = self.bookies.get(bookie_id)
        return None if bookie is None else bookie.held(stream_id, entry_id)

    def _on_zk_write(self, path: str, data: bytes) -> None:
        for stream in self.streams.values():
            if path == paths.stream_meta(stream.id):
                meta = StreamMeta.from_json(data)
                stream.checker.on_term_fixed(meta)
                stream.checker.on_trim(meta.first_entry_id)

    # ------------------------------------------------------------------ services

    async def start_services(self, **options: Any) -> SimServices:
        """Runs the real retention service, auditor, replication workers and scrub in this
        simulation (`stream.sim.services.SimServices` takes `options`); `finish()` stops
        them before the final takeover."""
        self.services = SimServices(self, **options)
        await self.services.start()
        return self.services

    async def run_retention_once(self) -> None:
        """Runs one retention round now (after `start_services`)."""
        assert self.services is not None, "start_services first"
        await self.services.run_retention_once()

    async def run_audit_once(self) -> None:
        """Runs one audit pass now (after `start_services`)."""
        assert self.services is not None, "start_services first"
        await self.services.run_audit_once()

    # ------------------------------------------------------------------ tasks

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Runs `coro` as a tracked task (cancelled when the simulation ends)."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def client(self, name: str, stream: str = STREAM_NAME) -> SimClient:
        """Returns the client node `name`, created on first use (for `stream`)."""
        client = self.clients.get(name)
        if client is None:
            client = self.clients[name] = SimClient(self, name, stream)
        return client

    async def guarded(
        self, name: str, what: str, failed: str, call: Coroutine[Any, Any, T]
    ) -> T | None:
        """Returns what client `name`'s `call` returns, None when it failed: a `StreamError`
        (a refusal the application sees) is traced as `failed`; any other exception is a bug
        of the client, a `client-error` violation."""
        try:
            return await call
        except StreamError as e:
            self.trace.record(failed, c=name, error=type(e).__name__)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._unexpected(f"{name}'s {what}", e)
        return None

    def _unexpected(self, what: str, error: BaseException) -> None:
        self.checker.violate(CLIENT_ERROR, f"{what} raised {error!r}")

    # ------------------------------------------------------------------ writers

    async def open_writer(self, name: str, *, reengage: bool = False) -> AsyncStreamWriter | None:
        """Takes the stream over from client `name` with a new writer (a new term, its
        recovery); returns it, or None when the takeover failed. With `reengage` the writer
        takes the stream back whenever another supersedes it."""
        client = self.client(name)
        writer = AsyncStreamWriter(
            client.stream,
            transport=client.transport,
            metadata=client.metadata,
            clock=client.clock,
            rng=client.rng,
            options=self.writer_options,
            identity=WriterIdentity(name),
            reengage=reengage,
        )
        self.trace.record("takeover", c=name)

        async def opened() -> bool:
            await writer.open()
            return True

        if not await self.guarded(name, "takeover", "takeover_failed", opened()):
            return None
        client.writers.append(writer)
        self.trace.record("opened", c=name, t=writer.term)
        return writer

    def start_takeover(self, name: str, *, reengage: bool = False) -> None:
        """Starts a takeover by client `name` in the background (unless one is running)."""
        client = self.client(name)
        if client.opening is not None and not client.opening.done():
            return
        client.opening = self.spawn(self.open_writer(name, reengage=reengage))

    async def seal(self, name: str) -> bool:
        """Seals the stream through client `name` (a takeover, then the SEALED state);
        returns whether it did."""
        client = self.client(name)
        self.trace.record("seal", c=name)

        async def sealed() -> bool:
            await seal(
                client.stream,
                transport=client.transport,
                metadata=client.metadata,
                clock=client.clock,
                rng=client.rng,
                options=self.writer_options,
                identity=WriterIdentity(name),
            )
            return True

        if not await self.guarded(name, "seal", "seal_failed", sealed()):
            return False
        self.trace.record("sealed", c=name)
        return True

    def append(self, name: str, count: int, *, size: int = 0) -> int:
        """Appends `count` payloads (padded to `size` bytes) through client `name`'s current
        writer; returns how many were queued. Each acknowledgment is reported to the checker
        as it happens."""
        client = self.client(name)
        writer = client.writer
        queued = 0
        if writer is None:
            return 0
        for _ in range(count):
            payload = payload_of(name, client.sequence, size)
            client.sequence += 1
            try:
                pending = writer.append_nowait(payload)
            except StreamError:
                break
            queued += 1
            self._unresolved[writer] += 1
            if isinstance(pending, asyncio.Future):
                pending.add_done_callback(functools.partial(self._acked, name, writer, payload))
            else:
                waiting = self.spawn(self._await_ack(name, writer, payload, pending))
                close_when_done(waiting, pending)
        self.trace.record("append", c=name, n=queued)
        return queued

    def _acked(
        self, name: str, writer: AsyncStreamWriter, payload: bytes, future: asyncio.Future[int]
    ) -> None:
        self._unresolved[writer] -= 1
        if future.cancelled():
            return
        error = future.exception()
        if error is None:
            self._checker_of(name).on_ack(name, writer.term, future.result(), payload)
        elif isinstance(error, NotEnoughBookiesError):
            self._gave_up(name, writer, error)
        elif not isinstance(error, StreamError):
            self._unexpected(f"{name}'s append", error)

    async def _await_ack(
        self, name: str, writer: AsyncStreamWriter, payload: bytes, pending: Any
    ) -> None:
        try:
            entry_id = await pending
        except NotEnoughBookiesError as e:
            self._gave_up(name, writer, e)
            return
        except StreamError:
            return
        finally:
            self._unresolved[writer] -= 1
        self._checker_of(name).on_ack(name, writer.term, entry_id, payload)

    def _gave_up(self, name: str, writer: AsyncStreamWriter, error: NotEnoughBookiesError) -> None:
        """Judges a writer whose ensemble change gave up (its error names the member it was
        replacing) by the needless-give-up property, once."""
        seen = self.pins.sampled(writer)
        waited = error.context.get("bookie")
        if seen is None or not isinstance(waited, str) or "ensemble" not in error.context:
            return  # not an ensemble change's error (a placement, a takeover)
        if self.config.write_cache_max_bytes is not None:
            return  # every bookie may answer TOO_BUSY: no spare is surely usable
        spares = [
            b
            for b in self.bookies
            if b not in self.config.journal_less or not journal_required(self.config.ack_quorum)
        ]
        give_up = GiveUp(name, writer.term, self.loop.time(), waited)
        self._checker_of(name).on_give_up(give_up, seen, self.history, spares)

    def _checker_of(self, name: str) -> Checker:
        """Returns the checker of client `name`'s stream: of the incarnation it was created
        for (a stream deleted and created again under its name is judged apart, and what
        the old one's writers and readers get belongs to the old one)."""
        client = self.client(name)
        return (client.incarnation or self.streams[client.stream]).checker

    # ------------------------------------------------------------------ scripting

    async def until(
        self, predicate: Callable[[], object], timeout_s: float = 5.0, step_s: float = 0.0005
    ) -> bool:
        """Returns True as soon as `predicate()` holds (checked every `step_s` of virtual
        time), False after `timeout_s`."""
        deadline = self.loop.time() + timeout_s
        while not predicate():
            if self.loop.time() >= deadline:
                return False
            await asyncio.sleep(step_s)
        return True

    def holds(self, bookie_id: str, entry_id: int) -> bytes | None:
        """Returns the payload `bookie_id` holds for `entry_id` now (None: absent or down)."""
        entry = self.bookies[bookie_id].held(self.stream_id, entry_id)
        return None if entry is None else entry.payload

    def acked(self, entry_id: int) -> bool:
        """Returns whether `entry_id` was acknowledged to some writer."""
        return entry_id in self.checker.acked

    # ------------------------------------------------------------------ readers

    def reader(self, name: str) -> AsyncStreamReader:
        """Returns a new reader (not opened) of client `name`."""
        client = self.client(name)
        return AsyncStreamReader(
            client.stream,
            transport=client.transport,
            metadata=client.metadata,
            rng=client.rng,
            options=self.reader_options,
        )

    async def read(
        self, name: str, span: int = 1_000_000
    ) -> tuple[int, int, list[tuple[int, bytes]]] | None:
        """Reads the last `span` committed entries through client `name`'s reader, reports
        what it returned to the checker and returns `(first, last, [(id, payload)])` (None
        when the read failed or the stream is empty)."""
        reader = self.reader(name)

        async def whole() -> tuple[int, int, list[tuple[int, int, bytes]]] | None:
            await reader.open()
            lac = await reader.lac()
            if lac < 0:
                return None
            first = max(reader.meta.first_entry_id, lac - span + 1)
            got: list[tuple[int, int, bytes]] = []
            async for batch in reader.read(first, lac):
                got.extend((e.entry_id, e.timestamp_ms, e.payload) for e in batch)
            return first, lac, got

        result = await self.guarded(name, "read", "read_failed", whole())
        if result is None:
            return None
        first, lac, got = result
        checker = self._checker_of(name)
        entries = [(entry_id, payload) for entry_id, _, payload in got]
        checker.on_read(name, first, lac, entries)
        checker.on_timestamps(name, [(entry_id, stamp) for entry_id, stamp, _ in got])
        return first, lac, entries

    # ------------------------------------------------------------------ faults

    def crash(
        self, bookie_id: str, *, lose_disk: bool = False, downtime_s: float | None = None
    ) -> None:
        """Crashes `bookie_id` (losing what is not durable, or its whole disk) and restarts it
        after `downtime_s` (None: only when `restart` is called)."""
        bookie = self.bookies[bookie_id]
        if not bookie.up:
            return
        self.faults += 1
        if lose_disk or not bookie.journal_write_data:
            self.lossy_crashes += 1
            self.lossy_bookies.add(bookie_id)
        bookie.crash(lose_disk=lose_disk)
        self._went_down(bookie_id)
        self.network.break_streams(bookie_id, "bookie crashed")
        # Its registration goes when its ZooKeeper session times out (a little later).
        session = self._bookie_sessions[bookie_id]
        self.loop.call_later(
            self.rng.uniform(0.0, 0.2), lambda: self._expire_if_down(bookie_id, session)
        )
        if downtime_s is not None:
            self._restarts[bookie_id] = self.loop.call_later(downtime_s, self.restart, bookie_id)

    def crash_at_sync(
        self,
        bookie_id: str,
        syncs: int,
        *,
        downtime_s: float | None = None,
        within_s: float = 0.5,
    ) -> None:
        """Crashes `bookie_id` in the middle of its storage work: the power is cut at its
        disk's sync after `syncs` more (between a journal group's writes and its fdatasync,
        an entry log's writes and its sync, the entry logs and the index commit...), or, if
        it syncs no more within `within_s`, between its jobs then. Restarts it after
        `downtime_s` as `crash`. A journal-less bookie takes its share of the loss budget
        now (`may_lose_data`)."""
        bookie = self.bookies[bookie_id]
        if not bookie.up or bookie.on_power_cut is not None:
            return
        if not bookie.journal_write_data:
            self.lossy_bookies.add(bookie_id)

        def crash() -> None:
            self.crash(bookie_id, downtime_s=downtime_s)

        bookie.arm_power_cut(syncs, crash)
        incarnation = bookie.incarnation

        def no_sync_in_time() -> None:
            if bookie.incarnation == incarnation and bookie.on_power_cut is crash:
                bookie.disarm_power_cut()
                crash()

        self.loop.call_later(within_s, no_sync_in_time)

    def may_lose_data(self, bookie_id: str) -> bool:
        """Returns whether a crash of `bookie_id` that loses data (a disk wipe, or no journal)
        stays within the fault model: every acknowledged entry is on AQ bookies, so fewer than
        AQ distinct bookies losing data (any number of times) leaves a copy of each, and never
        puts AQ bookies of one write set in limbo. With AQ = 1, none may."""
        # Not even a bookie that holds nothing: a takeover may be about to name it, and its
        # phase one would then put the stream in limbo.
        return (
            bookie_id in self.lossy_bookies or len(self.lossy_bookies) < self.config.ack_quorum - 1
        )

    def stop_cleanly(self, bookie_id: str, downtime_s: float) -> None:
        """Stops `bookie_id` cleanly (everything flushed, no phase one at its next start) and
        starts it again after `downtime_s`."""
        bookie = self.bookies[bookie_id]
        if not bookie.up:
            return
        self.faults += 1
        bookie.stop_cleanly()
        self._went_down(bookie_id)
        self.network.break_streams(bookie_id, "bookie stopped")
        self._bookie_sessions[bookie_id].close()
        self._restarts[bookie_id] = self.loop.call_later(downtime_s, self.restart, bookie_id)

    def _went_down(self, bookie_id: str) -> None:
        """Notes in the fault history that `bookie_id` is down and, until it registers
        again, absent from the registrations (its session goes a little later)."""
        self.history.start("down", bookie_id)
        self.history.start("unregistered", bookie_id)

    def _expire_if_down(self, bookie_id: str, session: SimMetadataSession) -> None:
        if self._bookie_sessions.get(bookie_id) is session and not self.bookies[bookie_id].up:
            session.close()

    def restart(self, bookie_id: str) -> None:
        """Starts `bookie_id` again (phase one first when it stopped uncleanly)."""
        handle = self._restarts.pop(bookie_id, None)
        if handle is not None:
            handle.cancel()
        bookie = self.bookies[bookie_id]
        if bookie.up:
            return
        if bookie.disk.fault == "full":
            # The real bookie cannot open its storage on a full disk: it starts once the disk
            # has room again (`_heal_disk`).
            self._blocked_restarts.add(bookie_id)
            self.trace.record("restart_blocked", b=bookie_id)
            return
        self._bookie_sessions[bookie_id].close()
        bookie.start()
        self.history.end("down", bookie_id)
        self._register(bookie_id)

    def pause(self, name: str, duration_s: float) -> None:
        """Pauses node `name` (every message to or from it is held) for `duration_s`."""
        self.faults += 1
        self.network.clog_node(name, duration_s)

    def expire_session(self, name: str, reconnect_after_s: float) -> None:
        """Expires client `name`'s ZooKeeper session; it gets a new one later."""
        self.faults += 1
        self.trace.record("expire", c=name)
        self.history.start("session", name, duration_s=reconnect_after_s)
        self.client(name).zk.expire(reconnect_after_s)

    def expire_bookie_session(self, bookie_id: str, reconnect_after_s: float) -> None:
        """Expires `bookie_id`'s metadata session while it keeps serving: its registration
        goes (placement no longer sees it) until it registers again after
        `reconnect_after_s`, if it is still up and nothing else replaced that session."""
        self.faults += 1
        session = self._bookie_sessions[bookie_id]
        session.close()
        self.history.start("unregistered", bookie_id)
        self.trace.record("bookie_expire", b=bookie_id)

        def reconnect() -> None:
            if self._bookie_sessions.get(bookie_id) is session and self.bookies[bookie_id].up:
                self._register(bookie_id)

        self.loop.call_later(reconnect_after_s, reconnect)

    def lose_zk_reply(
        self,
        name: str,
        *,
        when: Callable[[], bool] | None = None,
        meanwhile: Callable[[], object] | None = None,
    ) -> None:
        """Loses the reply of client `name`'s next metadata multi-op (applied, unanswered);
        with `when`, of its next one after which `when()` holds (it looks at the metadata).
        `meanwhile` runs right after that multi-op landed, before the client hears anything:
        another client's change that lands first."""
        self.faults += 1
        client = self.client(name)
        self.history.start("lost_reply", name)
        if when is None and meanwhile is None:
            client.replies_to_lose += 1
        else:
            client.lost_replies.append((when or (lambda: True), meanwhile))

    # ------------------------------------------------------------------ checking

    def _stream(self, stream: SimStream | None) -> SimStream:
        return stream or self.streams[STREAM_NAME]

    def snapshot(self, stream: SimStream | None = None) -> tuple[StreamMeta, int, list[Fragment]]:
        """Returns the stream's current `(meta, version, fragments)` (the first stream's by
        default), read directly (no network), parsed again only when the meta version moved."""
        stream_id = self._stream(stream).id
        stat = self.zk.exists(paths.stream_meta(stream_id))
        cached = self._snapshots.get(stream_id)
        if cached is None or stat is None or cached[1] != stat.version:
            cached = self._snapshots[stream_id] = self.admin.get_snapshot(stream_id)
        return cached

    def check(self) -> None:
        """Checks properties 2 and 8 over every bookie now (the checker's scans), on every
        stream not deleted, and samples every live writer's pipeline (`PinWatch`)."""
        now = self.loop.time()
        for client in self.clients.values():
            for writer in client.writers:
                if writer.error is None:
                    self.pins.sample(writer, writer.pipeline, now)
        for stream in self.streams.values():
            if self.deleted(stream):
                continue
            meta, _, fragments = self.snapshot(stream)
            held = self._holder(stream)
            checker = stream.checker
            checker.scan_bookies(stream.id, meta.quorum, fragments, self._peer_entry)
            checker.scan_log(
                meta.quorum, fragments, meta.first_entry_id, self._highest_lac(stream.id), held
            )

    def _holder(self, stream: SimStream) -> Callable[[str, int], Any]:
        """Returns `held(bookie, entry)`: what that bookie holds of `stream` now."""
        return lambda bookie_id, entry_id: self._peer_entry(bookie_id, stream.id, entry_id)

    def _held(self, bookie_id: str, entry_id: int) -> Any:
        return self._peer_entry(bookie_id, self.stream_id, entry_id)

    def _highest_lac(self, stream_id: int) -> int:
        """Returns the highest LAC a bookie that is up knows for the stream."""
        states = (b.streams.get(stream_id) for b in self.bookies.values() if b.up)
        return max((state.lac for state in states if state is not None), default=-1)

    async def _check_write_quorum(self, stream: SimStream) -> None:
        """Checks property 7 once the bookies' background repair had its chance (limbo
        bookies copy their share once a newer recovery fixed the end)."""
        meta, _, fragments = self.snapshot(stream)
        # No replication worker runs here (a bookie that lost data is repaired by phase two
        # only when limbo named the stream), so what a lossy crash took is excused.
        excused = frozenset(self.lossy_bookies)
        first = meta.first_entry_id
        held = self._holder(stream)
        await self.until(
            lambda: write_quorum_gap(meta.quorum, fragments, first, held, excused) is None,
            timeout_s=2.0,
            step_s=0.05,
        )
        stream.checker.check_write_quorum(meta.quorum, fragments, first, held, excused)

    async def finish(self, *, settle_s: float = 0.5) -> None:
        """Heals every fault, stops every writer, runs a last takeover and a last read of the
        whole of every stream not deleted, and gives them to the checkers."""
        if self.services is not None:
            await self.services.stop()
        for bookie in self.bookies.values():
            bookie.disarm_power_cut()
        self.network.faults = replace(
            self.network.faults, spike_rate=0.0, loss_rate=0.0, duplicate_rate=0.0
        )
        self.network.heal()
        for client in self.clients.values():
            client.replies_to_lose = 0
            client.lost_replies.clear()
            self.history.end("lost_reply", client.name)
        for bookie_id in sorted(self.disk_faults):
            self.set_disk_fault(bookie_id, None)
        for bookie_id in sorted(self.bookies):
            self.restart_if_failed(bookie_id)
        for bookie_id, bookie in self.bookies.items():
            if not bookie.up:
                self.restart(bookie_id)
            elif self._bookie_sessions[bookie_id].zk.closed:
                self._register(bookie_id)  # its session expired while it served
        if self.stream_ops:
            # A delete or trim still running: it lands before the final views are taken.
            await asyncio.wait(list(self.stream_ops), timeout=10.0)
        # Zombies wake up: what they held is delivered now, and may get acknowledged.
        await asyncio.sleep(settle_s)
        self.check()
        await self._check_progress()
        for client in list(self.clients.values()):
            if client.opening is not None and not client.opening.done():
                client.opening.cancel()
            for writer in client.writers:
                try:
                    await asyncio.wait_for(writer.close(), 1.0)
                except (StreamError, TimeoutError):
                    pass
                except Exception as e:
                    self._unexpected(f"{client.name}'s close", e)
        await asyncio.sleep(0.05)
        for stream in list(self.streams.values()):
            if self.deleted(stream):
                stream.checker.on_deleted()
            else:
                await self._finish_stream(stream)
        self.finished = True

    async def _finish_stream(self, stream: SimStream) -> None:
        """The final takeover and read of `stream`, judged by its checker."""
        checker = stream.checker
        end = self.sealed_end(stream)
        if end is None:
            end = await self._final_takeover(stream)
        if end is None:
            end = self.sealed_end(stream)  # a seal still running when the faults healed
        if end is None:
            checker.violate(LIVENESS, "the final takeover did not complete")
            return
        self.check()
        await self._check_write_quorum(stream)
        got = await self._final_read(stream, end)
        if got is not None:
            checker.final(end, got)
        else:
            source = "the final read failed, and the bookies of its write set hold"
            checker.final(end, self._held_view(stream, end), source=source)

    def sealed_end(self, stream: SimStream | None = None) -> int | None:
        """Returns the last entry id of the stream once it is SEALED (the sealing term's
        no-op, where nothing follows), None while it is not."""
        meta = self.snapshot(stream)[0]
        if meta.state is not StreamState.SEALED or not meta.term_history:
            return None
        term, first_entry_id = meta.term_history[-1]
        if term != meta.term:
            return None
        # The sealing term's no-op is at its first entry, unless there was none: the stream's
        # first takeover recovers nothing, and the truncate no-op may be switched off.
        if len(meta.term_history) == 1 or TRUNCATE_NOOP in self.disabled:
            return first_entry_id - 1
        return first_entry_id

    def _final_name(self, stream: SimStream, role: str) -> str:
        """Returns the name of the client playing `role` at the end on `stream`."""
        name = role if stream.name == STREAM_NAME else f"{role}-{stream.name}"
        self.client(name, stream.name)
        return name

    async def _final_takeover(self, stream: SimStream) -> int | None:
        """Takes the stream over a last time and closes that writer; returns the end it
        fixed, None when no takeover completed."""
        name = self._final_name(stream, "final")
        final = None
        for _ in range(3):
            final = await self.open_writer(name)
            if final is not None:
                break
            await asyncio.sleep(0.5)
        if final is None:
            return None
        end = final.last_add_confirmed
        try:
            await asyncio.wait_for(final.close(), 2.0)
        except (StreamError, TimeoutError) as e:
            self.trace.record("final_close_failed", error=type(e).__name__)
        return end

    def _stalled(self) -> list[tuple[str, AsyncStreamWriter, int]]:
        return [
            (client.name, writer, self._unresolved[writer])
            for client in self.clients.values()
            for writer in client.writers
            if self._unresolved[writer] > 0 and writer.error is None
        ]

    async def _check_progress(self) -> None:
        """docs/design.md §10 progress: with every fault healed and E writable bookies up, a writer
        that has not failed resolves every append it took within `PROGRESS_S` (acknowledged, or
        failed with an error naming why). A stall with no error is a violation."""
        writable = [b for b, bookie in self.bookies.items() if bookie.up]
        if len(set(writable) - self.read_only) < self.config.ensemble:
            return
        deadline = self.loop.time() + PROGRESS_S
        while self._stalled() and self.loop.time() < deadline:
            await asyncio.sleep(0.05)
        for name, writer, count in self._stalled():
            self._checker_of(name).violate(
                PROGRESS,
                f"writer {name} (term {writer.term}) left {count} appends neither acknowledged "
                f"nor failed {PROGRESS_S:.0f}s after every fault healed, with no error",
            )

    def _held_view(self, stream: SimStream, end: int) -> dict[int, bytes]:
        """Returns, for each id up to `end`, a non-no-op payload some bookie of its write set
        holds (preferring the acknowledged one): what a reader could still find."""
        meta, _, fragments = self.snapshot(stream)
        firsts = [(f.first_entry_id, f.ensemble) for f in fragments]
        view: dict[int, bytes] = {}
        for entry_id in range(max(meta.first_entry_id, 0), end + 1):
            ensemble = firsts[fragment_index_for(firsts, entry_id)][1]
            ack = stream.checker.acked.get(entry_id)
            for bookie_id in meta.quorum.write_set_bookies(ensemble, entry_id):
                entry = self.bookies[bookie_id].held(stream.id, entry_id)
                if entry is None or entry.flags & EntryFlag.NOOP:
                    continue
                view.setdefault(entry_id, entry.payload)
                if ack is not None and entry.payload == ack.payload:
                    view[entry_id] = entry.payload
        return view

    async def _final_read(self, stream: SimStream, end: int) -> dict[int, bytes] | None:
        """Returns the final reader's view of `0..end` (no-ops left out), None when it could
        not read that far."""
        if end < 0:
            return {}
        name = self._final_name(stream, "final-reader")
        for _ in range(5):
            result = await self.read(name)
            first = self.first_retained_entry(stream)
            if result is not None and result[0] <= first and result[1] >= end:
                return dict(result[2])
            await asyncio.sleep(0.2)
        stream.checker.violate(LIVENESS, f"the final read of the stream up to {end} failed")
        return None

    def first_retained_entry(self, stream: SimStream | None = None) -> int:
        """Returns the stream's first retained entry id (the final read starts there)."""
        meta, _ = self.admin.get_stream_by_id(self._stream(stream).id)
        return meta.first_entry_id

    async def shutdown(self) -> None:
        """Cancels every task still running (writers' and bookies' included), again while
        cancelled tasks start new ones (a bounded number of rounds), so that no coroutine of
        this run is left to be finalized later, on another run's loop."""
        self.finished = True
        for client in self.clients.values():
            for writer in client.writers:
                _abort(writer)
        current = asyncio.current_task()
        for _ in range(20):
            pending = [t for t in asyncio.all_tasks(self.loop) if t is not current]
            if not pending:
                return
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        log.warning("sim.tasks_left_running", seed=self.seed)


def payload_of(name: str, sequence: int, size: int = 0) -> bytes:
    """Returns the payload client `name` appends as its `sequence`th (padded to `size` bytes):
    unique within a run."""
    return f"{name}#{sequence}".encode().ljust(size, b".")


def _abort(writer: AsyncStreamWriter) -> None:
    """Stops `writer` at once, without flushing: its pending appends fail. A writer whose tasks
    are merely cancelled restarts its roll from `_roll`'s `finally`, so it must be stopped
    first."""
    writer.abort()
