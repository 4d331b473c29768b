"""BP-46 phase two (docs/design.md §4 "Crash protection without the journal"): a bookie that
may have lost acknowledged entries repairs each of its limbo streams in the background. Per
stream: a fixed end (a recovery by a newer term, running one when needed), every entry this
bookie should hold up to it copied from its peers, a flush, then limbo cleared.

It runs inside the bookie process but works as a client (it takes streams over and reads its
peers), so it lives with the services, above the client in the package layers; the bookie
hands it its storage through `LocalCopies` and never imports the client itself."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import Counter, Gauge, Histogram

from stream.client.explicit_lac import send_lac
from stream.client.options import WriterOptions
from stream.client.ports import BookieTransport, WallClock
from stream.client.recovery import Takeover, WriterIdentity
from stream.clock import SystemClock
from stream.errors import InvalidTermError, StreamError, StreamNotFoundError, StreamSealedError
from stream.framing.verify import good_run
from stream.logs import get_logger
from stream.metadata.model import Fragment, StreamMeta, StreamState
from stream.protocol.invariant import invariant
from stream.protocol.rereplication import plan_copy_runs
from stream.security.tls import TLSConfig
from stream.wire import bookie_pb2 as pb

log = get_logger(__name__)

# Phase two bounds: streams repaired at once, ids scanned per index pass, entries per copy
# read, copy reads in flight per stream, payload bytes per ReadRange message, stored bytes
# between two flushes.
REPAIR_PARALLELISM = 4
_SCAN_WINDOW_IDS = 65_536
_COPY_RUN_MAX_ENTRIES = 4_096
_COPY_PARALLEL_RUNS = 8
_COPY_BATCH_BYTES = 1 << 20
_FLUSH_EVERY_BYTES = 32 << 20
# Deadline of one ReadRange of a copy run (a run that stops early is continued elsewhere).
_COPY_RUN_TIMEOUT_S = 30.0
# Retries of a repair attempt that could not finish: backoff doubling up to the cap, forever
# while the bookie runs (the stream must stay in limbo until repaired).
_RETRY_BACKOFF_S = 0.1
_RETRY_BACKOFF_MAX_S = 5.0
# A recovery by someone else (a re-engaging writer) is left to finish this long before the
# repair takes over itself: fencing it earlier would fail that writer.
_FOREIGN_RECOVERY_PATIENCE_S = 15.0
_PROGRESS_LOG_EVERY_ENTRIES = 50_000

REPAIR_STREAMS_PENDING = Gauge(
    "streamkeeper_bookie_repair_streams_pending", "Limbo streams phase two has yet to repair"
)
REPAIR_STREAMS = Counter(
    "streamkeeper_bookie_repair_streams_total",
    "Limbo streams phase two finished, by outcome",
    ["outcome"],
)  # outcome: repaired | stream_deleted | not_a_member | not_in_limbo
REPAIR_FAILED_ATTEMPTS = Counter(
    "streamkeeper_bookie_repair_failed_attempts_total",
    "Repair attempts that could not finish and will be retried (the stream stays in limbo)",
)
REPAIR_TAKEOVERS = Counter(
    "streamkeeper_bookie_repair_takeovers_total",
    "Takeovers (new term and recovery) phase two ran to fix the end of a stream",
)
REPAIR_ENTRIES_COPIED = Counter(
    "streamkeeper_bookie_repair_entries_copied_total", "Entries phase two copied from peers"
)
REPAIR_BYTES_COPIED = Counter(
    "streamkeeper_bookie_repair_bytes_copied_total", "Payload bytes phase two copied from peers"
)
REPAIR_STREAM_SECONDS = Histogram(
    "streamkeeper_bookie_repair_stream_seconds",
    "Time from the start of a stream's repair to its limbo being cleared",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)


class LimboState(Protocol):
    @property  # read-only: the storage's view is frozen
    def limbo(self) -> bool: ...


class LocalCopies(Protocol):
    """What phase two needs of the bookie's storage engine (`StreamStorage`)."""

    def stream_state(self, stream_id: int) -> LimboState | None: ...
    def missing_entry_ids(self, stream_id: int, entry_ids: list[int]) -> list[int]: ...
    def store_copies(self, stream_id: int, entries: list[pb.Entry]) -> int: ...
    def request_flush(self) -> Future[None]: ...
    def set_limbo(self, stream_id: int, limbo: bool, term: int | None = None) -> Future[None]: ...


# -- phase two: planning (pure) -------------------------------------------------------------


def fixed_end(
    meta: StreamMeta, fragments: Sequence[Fragment], bookie_id: str, bound_term: int
) -> int | None:
    """Returns the id up to which the entries this bookie should hold are fixed for good and
    include every entry it may have lost, or None when a recovery must fix the end first.

    The entries lost were acknowledged in terms <= `bound_term`. A term above it that finished
    its recovery started at its truncate no-op: every entry of the terms before lies below
    that id. Without such a term, when this bookie is not in the last fragment, every entry of
    the fragments before it reached its whole write set (a fragment starts at the LAFR + 1 of
    the one it follows), so those are fixed too. A SEALED stream ends at its last no-op."""
    if meta.state is StreamState.SEALED:
        first = meta.last_term_first_entry_id()
        return (first if first is not None else meta.first_entry_id) - 1
    for term, first_entry_id in meta.term_history:
        if term > bound_term:
            return first_entry_id - 1
    if fragments and bookie_id not in fragments[-1].ensemble:
        return fragments[-1].first_entry_id - 1
    return None


@dataclass(frozen=True)
class HoldSpan:
    """Entries `first_entry_id..last_entry_id` of a fragment on `ensemble`, which names the
    bookie: it holds those of them whose write set names it."""

    first_entry_id: int
    last_entry_id: int
    ensemble: tuple[str, ...]


def spans_to_hold(
    meta: StreamMeta, fragments: Sequence[Fragment], bookie_id: str, last_entry_id: int
) -> list[HoldSpan]:
    """Returns the fragment spans up to `last_entry_id` (from the first retained entry) whose
    ensemble names `bookie_id`."""
    spans = []
    for i, fragment in enumerate(fragments):
        first = max(fragment.first_entry_id, meta.first_entry_id)
        last = last_entry_id
        if i + 1 < len(fragments):
            last = min(last, fragments[i + 1].first_entry_id - 1)
        if bookie_id in fragment.ensemble and first <= last:
            spans.append(HoldSpan(first, last, tuple(fragment.ensemble)))
    return spans


def ids_to_hold(meta: StreamMeta, span: HoldSpan, bookie_id: str) -> Iterator[list[int]]:
    """Yields, in windows of bounded size, the ids of `span` whose write set names
    `bookie_id`."""
    index = span.ensemble.index(bookie_id)
    for window_first in range(span.first_entry_id, span.last_entry_id + 1, _SCAN_WINDOW_IDS):
        window_last = min(window_first + _SCAN_WINDOW_IDS - 1, span.last_entry_id)
        ids = list(meta.quorum.bookie_index_entries(index, window_first, window_last))
        if ids:
            yield ids


# -- phase two: the repair ------------------------------------------------------------------


class _RetryRepair(Exception):
    """This attempt cannot finish now; the stream stays in limbo and is tried again."""


@dataclass
class StreamRepair:
    """How one limbo stream's repair ended: `outcome` (repaired, stream_deleted, not_a_member,
    not_in_limbo), entries copied, whether a takeover ran, attempts, seconds."""

    stream_id: int
    outcome: str = ""
    copied: int = 0
    took_over: bool = False
    attempts: int = 0
    seconds: float = 0.0
    # A foreign recovery seen in progress: term -> when first seen (loop time).
    recoveries_seen: dict[int, float] = field(default_factory=dict)


class Repairer:
    """Phase two: repairs this bookie's limbo streams, `parallelism` at a time, each retried
    until it is repaired (or the bookie stops: `run` is then cancelled and the next boot
    resumes, limbo being durable). Runs on the storage's thread (the event loop)."""

    def __init__(
        self,
        *,
        bookie_id: str,
        storage: LocalCopies,
        write_cache_max_bytes: int,
        metadata: Any,
        transport: BookieTransport,
        options: WriterOptions | None = None,
        rng: random.Random | None = None,
        parallelism: int = REPAIR_PARALLELISM,
        clock: WallClock | None = None,
        identity: WriterIdentity | None = None,
    ) -> None:
        """`metadata` is a `MetadataPort` that also has `get_snapshot` (`ZkMetadata`);
        `clock` is the takeover's wall clock and `identity` its writer identity (the
        simulator passes its own, for runs that replay identically)."""
        invariant(parallelism >= 1, "repair parallelism must be >= 1")
        self._bookie_id = bookie_id
        self._storage = storage
        self._metadata = metadata
        self._transport = transport
        self._options = options or WriterOptions()
        self._rng = rng or random.Random()
        self._parallelism = parallelism
        # Copies skip the write cache's limit (a repair must not be refused): flush well
        # before a small cache would refuse the writers' adds (TOO_BUSY).
        self._flush_every_bytes = max(1, min(_FLUSH_EVERY_BYTES, write_cache_max_bytes // 4))
        self._unflushed_bytes = 0  # copied since the last flush, all streams
        self._clock = clock or SystemClock()
        self._identity = identity or WriterIdentity(
            f"bookie-repair-{bookie_id}", socket.gethostname(), os.getpid()
        )
        self.results: dict[int, StreamRepair] = {}

    async def run(self, bounds: dict[int, int]) -> dict[int, StreamRepair]:
        """Repairs every stream of `bounds` ({stream id: bound term}, see `limbo_bounds`);
        returns how each ended."""
        if not bounds:
            return {}
        started = asyncio.get_running_loop().time()
        queue = deque(sorted(bounds))
        REPAIR_STREAMS_PENDING.set(len(queue))
        log.info("integrity.phase_two_started", streams=len(queue), parallelism=self._parallelism)

        async def worker() -> None:
            while queue:
                stream_id = queue.popleft()
                self.results[stream_id] = await self._repair_stream(stream_id, bounds[stream_id])
                REPAIR_STREAMS_PENDING.set(len(bounds) - len(self.results))

        await asyncio.gather(*(worker() for _ in range(min(self._parallelism, len(queue)))))
        log.info(
            "integrity.phase_two_done",
            streams=len(self.results),
            copied=sum(r.copied for r in self.results.values()),
            takeovers=sum(1 for r in self.results.values() if r.took_over),
            seconds=round(asyncio.get_running_loop().time() - started, 3),
        )
        return self.results

    async def _repair_stream(self, stream_id: int, bound_term: int) -> StreamRepair:
        repair = StreamRepair(stream_id)
        started = asyncio.get_running_loop().time()
        backoff = _RETRY_BACKOFF_S
        log.info("integrity.repair_started", stream_id=stream_id, bound_term=bound_term)
        while True:
            repair.attempts += 1
            try:
                repair.outcome = await self._attempt(stream_id, bound_term, repair)
                break
            except asyncio.CancelledError:
                raise
            except (StreamError, _RetryRepair) as e:
                REPAIR_FAILED_ATTEMPTS.inc()
                log.info(
                    "integrity.repair_retry",
                    stream_id=stream_id,
                    attempt=repair.attempts,
                    reason=str(e),
                    backoff_s=round(backoff, 3),
                )
            except Exception:  # a bug; keep the stream in limbo and try again later
                REPAIR_FAILED_ATTEMPTS.inc()
                log.exception("integrity.repair_failed", stream_id=stream_id)
            await asyncio.sleep(backoff * (0.5 + self._rng.random()))
            backoff = min(backoff * 2, _RETRY_BACKOFF_MAX_S)
        repair.seconds = asyncio.get_running_loop().time() - started
        REPAIR_STREAMS.labels(outcome=repair.outcome).inc()
        REPAIR_STREAM_SECONDS.observe(repair.seconds)
        log.info(
            "integrity.repair_done",
            stream_id=stream_id,
            outcome=repair.outcome,
            copied=repair.copied,
            took_over=repair.took_over,
            attempts=repair.attempts,
            seconds=round(repair.seconds, 3),
        )
        return repair

    async def _attempt(self, stream_id: int, bound_term: int, repair: StreamRepair) -> str:
        """One try at repairing `stream_id`; returns the outcome or raises to be retried."""
        state = self._storage.stream_state(stream_id)
        if state is None or not state.limbo:
            return "not_in_limbo"
        try:
            meta, _, fragments = await self._metadata.get_snapshot(stream_id)
        except StreamNotFoundError:
            # Deleted: nobody will ask this bookie about it again.
            await self._clear_limbo(stream_id)
            return "stream_deleted"
        if not any(self._bookie_id in f.ensemble for f in fragments):
            # No fragment (left) names this bookie: nobody reads or recovers from it.
            await self._clear_limbo(stream_id)
            return "not_a_member"
        end = fixed_end(meta, fragments, self._bookie_id, bound_term)
        if end is None:
            await self._take_over(meta, repair)
            meta, _, fragments = await self._metadata.get_snapshot(stream_id)
            end = fixed_end(meta, fragments, self._bookie_id, bound_term)
            if end is None:
                raise _RetryRepair("the stream's end is still open after the takeover")
        spans = spans_to_hold(meta, fragments, self._bookie_id, end)
        for span in spans:
            repair.copied += await self._copy_span(meta, span, end, repair)
        # Verify (the caches and the index) before the flush that makes the copies durable.
        for span in spans:
            for ids in ids_to_hold(meta, span, self._bookie_id):
                missing = self._storage.missing_entry_ids(meta.id, ids)
                if missing:
                    raise _RetryRepair(f"{len(missing)} entries still missing, first {missing[0]}")
        await self._wait(self._storage.request_flush())
        await self._clear_limbo(stream_id)
        log.info(
            "integrity.limbo_cleared",
            stream_id=stream_id,
            stream=meta.name,
            end_entry_id=end,
            copied=repair.copied,
        )
        return "repaired"

    async def _take_over(self, meta: StreamMeta, repair: StreamRepair) -> None:
        """Runs a takeover (new term, recovery: docs/design.md §5) so that the stream's end is
        fixed, and publishes the recovered LAC; raises `_RetryRepair` when another recovery runs or
        won."""
        loop = asyncio.get_running_loop()
        if meta.state is StreamState.IN_RECOVERY:
            seen = repair.recoveries_seen.setdefault(meta.term, loop.time())
            if loop.time() - seen < _FOREIGN_RECOVERY_PATIENCE_S:
                raise _RetryRepair(f"a recovery in term {meta.term} is running")
            log.warning("integrity.foreign_recovery_stuck", stream_id=meta.id, term=meta.term)
        log.info("integrity.takeover", stream_id=meta.id, stream=meta.name, term=meta.term + 1)
        try:
            result = await Takeover(
                meta.name,
                transport=self._transport,
                metadata=self._metadata,
                clock=self._clock,
                rng=self._rng,
                options=self._options,
                identity=self._identity,
            ).run()
        except InvalidTermError as e:
            raise _RetryRepair(f"another writer took over meanwhile: {e}") from None
        except StreamSealedError:
            raise _RetryRepair("the stream was sealed meanwhile") from None
        repair.took_over = True
        REPAIR_TAKEOVERS.inc()
        # Readers see the recovered entries at once, as after a seal.
        await send_lac(
            self._transport,
            meta.id,
            result.term,
            result.last_fragment.ensemble,
            result.last_entry_id,
            self._options.add_timeout_s,
        )
        with contextlib.suppress(StreamError):
            await self._metadata.unregister_writer(meta.id)

    async def _copy_span(
        self, meta: StreamMeta, span: HoldSpan, end: int, repair: StreamRepair
    ) -> int:
        """Copies the entries of `span` this bookie should hold and lacks; returns how many."""
        copied = 0
        logged = 0
        for ids in ids_to_hold(meta, span, self._bookie_id):
            missing = self._storage.missing_entry_ids(meta.id, ids)
            if not missing:
                continue
            copied += await self._copy_ids(meta, span.ensemble, missing)
            if copied - logged >= _PROGRESS_LOG_EVERY_ENTRIES:
                logged = copied
                log.info(
                    "integrity.repair_progress",
                    stream_id=meta.id,
                    copied=repair.copied + copied,
                    at_entry_id=ids[-1],
                    end_entry_id=end,
                )
        return copied

    async def _copy_ids(
        self, meta: StreamMeta, ensemble: tuple[str, ...], missing: list[int]
    ) -> int:
        """Copies the entries `missing` (ascending) from the other bookies of their write
        sets, one ReadRange per run of consecutive ids that one peer holds, up to
        `_COPY_PARALLEL_RUNS` runs at once (a striped ensemble gives runs of WQ ids at most);
        returns how many were stored. Raises `_RetryRepair` when no peer returns an entry."""
        runs = plan_copy_runs(
            meta.quorum,
            ensemble,
            self._bookie_id,
            missing,
            self._rng,
            max_run_entries=_COPY_RUN_MAX_ENTRIES,
        )
        slots = asyncio.Semaphore(_COPY_PARALLEL_RUNS)

        async def copy(peers: list[str], first: int, last: int) -> int:
            async with slots:
                return await self._copy_run(meta.id, peers, first, last)

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(copy(*run)) for run in runs]
        except BaseExceptionGroup as failed:
            # The first run that failed says why (the others were cancelled with it).
            raise failed.exceptions[0] from None
        return sum(t.result() for t in tasks)

    async def _copy_run(self, stream_id: int, peers: list[str], first: int, last: int) -> int:
        """Copies `first..last` from `peers` (the first one holds them all), storing as the
        batches arrive; where a peer stops, the next one is asked for the rest. Returns how
        many entries were stored."""
        stored = 0
        position = first
        for peer in peers:
            if position > last:
                break
            got, count = await self._copy_range(peer, stream_id, position, last)
            position += got
            stored += count
        if position <= last:
            raise _RetryRepair(f"no bookie of its write set returned entry {position}")
        return stored

    async def _copy_range(
        self, peer: str, stream_id: int, first: int, last: int
    ) -> tuple[int, int]:
        """Reads `first..last` from `peer` and stores each batch as it arrives, up to the first
        entry the peer lacks or returns with a bad checksum, or any error (an unknown answer).
        Returns (entries received in order from `first`, entries stored)."""
        received = 0
        stored = 0
        try:
            async for response in self._transport.read_range(
                peer,
                stream_id,
                first,
                last,
                max_batch_bytes=_COPY_BATCH_BYTES,
                timeout_s=_COPY_RUN_TIMEOUT_S,
            ):
                good = good_run(stream_id, first + received, response.entries)
                batch = list(response.entries[:good])
                stored += await self._store(stream_id, batch)
                received += len(batch)
                if len(batch) != len(response.entries) or response.code != pb.OK:
                    break
        except asyncio.CancelledError:
            raise
        except Exception as e:  # any failure is an unknown answer: ask another peer
            log.debug("integrity.copy_read_failed", bookie=peer, entry_id=first, error=repr(e))
        return received, stored

    async def _store(self, stream_id: int, entries: list[pb.Entry]) -> int:
        """Stores copied entries; flushes once enough were copied since the last flush (a big
        rebuild must not fill the write cache and starve the writers' adds)."""
        if not entries:
            return 0
        stored = self._storage.store_copies(stream_id, entries)
        size = sum(len(e.payload) for e in entries)
        REPAIR_ENTRIES_COPIED.inc(len(entries))
        REPAIR_BYTES_COPIED.inc(size)
        self._unflushed_bytes += size
        if self._unflushed_bytes >= self._flush_every_bytes:
            self._unflushed_bytes = 0
            await self._wait(self._storage.request_flush())
        return stored

    async def _clear_limbo(self, stream_id: int) -> None:
        await self._wait(self._storage.set_limbo(stream_id, False))

    async def close(self) -> None:
        """Closes the transport and the metadata port it was given (their channels and
        threads); call once `run` is over or cancelled."""
        transport: Any = self._transport
        metadata: Any = self._metadata
        with contextlib.suppress(Exception):
            await transport.close()
        with contextlib.suppress(Exception):
            metadata.close()

    @staticmethod
    async def _wait(future: Future[None]) -> None:
        await asyncio.wrap_future(future)


def make_repairer(
    *,
    bookie_id: str,
    listen: str,
    tls: TLSConfig | None,
    storage: LocalCopies,
    write_cache_max_bytes: int,
    session: Any,
) -> Repairer:
    """Returns a Repairer over the bookie's metadata session and a gRPC transport of its own
    (call on the event loop; `Repairer.close` releases them)."""
    from stream.client.grpc_transport import GrpcTransport
    from stream.client.zk_metadata import ZkMetadata

    metadata = ZkMetadata(session)

    async def resolve(peer: str) -> str | None:
        # This bookie may not be registered yet (a killed incarnation's node lingers).
        if peer == bookie_id:
            return listen
        return await metadata.bookie_address(peer)

    return Repairer(
        bookie_id=bookie_id,
        storage=storage,
        write_cache_max_bytes=write_cache_max_bytes,
        metadata=metadata,
        transport=GrpcTransport(resolve, tls=tls),
    )
