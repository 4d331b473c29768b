"""Data integrity of a bookie that may have lost acknowledged entries (BP-46, docs/design.md §4
"Crash protection without the journal").

Without the journal (`journal_write_data = false`) an add is acknowledged once it is in the
write cache; a crash loses what was not flushed yet. A wiped or replaced disk loses
everything. Either way the bookie must never again answer "no such entry" for an entry it once
acknowledged (BP-46 scenario 2), nor accept a write of a term that was fenced here before
(scenario 1). The boot does, in this order:

1. the cookie check (`stream.bookie.cookie`): a repairable mismatch is fixed only with
   `auto_fix_cookie = true` (or by hand, `streamctl bookie fix-cookie`);
2. **phase one**, before serving, when the previous run crashed after bypassing the journal or
   the cookie is being fixed: for every non-sealed stream with a fragment naming this bookie,
   local term := max(local, metadata term) and limbo on, all durable (journal, fsync); when
   the fix lost a directory, also the stream id counter below which terms may have been
   forgotten (`stream.bookie.terms`: the terms of SEALED streams and of streams no fragment
   names are learned from metadata on first use); then the fixed cookie is written;
3. serving and registration (a limbo stream answers UNKNOWN instead of an explicit negative);
4. **phase two** in the background (`Repairer`): per limbo stream, a fixed end (a recovery by
   a newer term, running one when needed), every entry this bookie should hold up to it
   copied from peers, a flush, then limbo cleared. Limbo is durable: a crash half-way just
   repeats the repair at the next boot.

Whether the previous run bypassed the journal is kept in a marker file in the index
directory: with the journal holding every acknowledged entry, a crash loses nothing, and
phase one (whose repairs make writers re-engage) would only cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from stream.bookie import metrics
from stream.bookie.config import BookieConfig
from stream.bookie.cookie import (
    CookieAction,
    CookieDecision,
    CookieStore,
    apply_cookie_fix,
    discard_index_for_fix,
    inspect_cookies,
)
from stream.bookie.storage.fsutil import fsync_dir
from stream.bookie.unsafe import SAFE, UNSAFE_SKIP_ENV, UnsafeSkips
from stream.client.options import WriterOptions
from stream.client.ports import BookieTransport, Clock, SystemClock
from stream.client.recovery import Takeover, WriterIdentity, send_lac
from stream.errors import (
    ConfigError,
    InvalidTermError,
    StreamError,
    StreamNotFoundError,
    StreamSealedError,
)
from stream.framing.verify import good_run
from stream.metadata.model import Fragment, StreamMeta, StreamState
from stream.protocol.invariant import invariant
from stream.protocol.rereplication import plan_copy_runs
from stream.wire import bookie_pb2 as pb

if TYPE_CHECKING:
    from stream.bookie.storage import StreamStorage
    from stream.bookie.terms import MetadataTerms

log = structlog.get_logger(__name__)

JOURNAL_BYPASS_MARKER = "JOURNAL_BYPASSED"

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


def metadata_terms(
    config: BookieConfig, storage: StreamStorage, session: Any, *, unsafe: UnsafeSkips = SAFE
) -> MetadataTerms:
    """Returns the service's checks against metadata (`stream.bookie.terms.MetadataTerms`):
    terms a lost disk took (when this bookie lost a directory), terms and trims metadata cannot
    justify. Call after `protect_at_boot`, on the event loop."""
    from stream.bookie.terms import (
        StreamFacts,
        forgotten_terms_bound,
        metadata_terms_for,
        read_stream_facts,
    )

    async def read_facts(stream_id: int) -> StreamFacts | None:
        return await asyncio.to_thread(read_stream_facts, session, stream_id)

    return metadata_terms_for(
        storage, read_facts, forgotten_below=forgotten_terms_bound(config), unsafe=unsafe
    )


def _note_forgotten_terms(config: BookieConfig, decision: CookieDecision, session: Any) -> None:
    """Records, before the fixed cookie, which streams' terms the lost directories may have
    taken (blocking)."""
    from stream.bookie.terms import note_forgotten_terms, read_next_stream_id

    if decision.lost_directories:
        note_forgotten_terms(config, read_next_stream_id(session))


# -- the journal-bypass marker --------------------------------------------------------------


def _marker_path(config: BookieConfig) -> Path:
    return config.index_path / JOURNAL_BYPASS_MARKER


def note_journal_mode(config: BookieConfig) -> bool:
    """Returns whether a previous run may have acknowledged entries without the journal (the
    marker exists); creates the marker durably when this run bypasses it. Call before the
    storage opens."""
    path = _marker_path(config)
    existed = path.exists()
    if not config.journal_write_data and not existed:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.write(b"entries were acknowledged without the journal (BP-46)\n")
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(path.parent)
    return existed


def settle_journal_mode(config: BookieConfig) -> None:
    """Removes the marker when this run writes entries to the journal again. Call once phase
    one (if any) is durable: from then on a crash loses nothing."""
    path = _marker_path(config)
    if config.journal_write_data and path.exists():
        path.unlink()
        fsync_dir(path.parent)
        log.info("integrity.journal_bypass_ended")


# -- phase one ------------------------------------------------------------------------------


def phase_one_reason(*, unclean: bool, journal_bypassed: bool, cookie_fix: bool) -> str | None:
    """Returns why phase one must run ("cookie", "unclean_shutdown"), or None when nothing
    acknowledged can have been lost: a clean shutdown flushes everything, and a crash while
    every entry went through the journal loses none."""
    if cookie_fix:
        return "cookie"
    if unclean and journal_bypassed:
        return "unclean_shutdown"
    return None


@dataclass(frozen=True)
class PhaseOneReport:
    """What phase one did: why it ran, the streams term-fenced (and put in limbo unless the
    test-only switch says otherwise), how long it took."""

    reason: str
    stream_ids: tuple[int, ...]
    limbo: bool
    seconds: float


def begin_phase_one(
    storage: StreamStorage,
    streams: Sequence[tuple[StreamMeta, Sequence[Fragment]]],
    *,
    unsafe: UnsafeSkips = SAFE,
) -> tuple[list[Future[None]], tuple[int, ...], bool]:
    """Journals phase one's changes (term := max(local, metadata term), limbo on) for every
    stream in `streams`; returns the futures of their sync, the stream ids and whether limbo
    was set. `run_phase_one` waits for the futures; the simulator commits its journal."""
    limbo = "limbo" not in unsafe
    if "phase_one" in unsafe:
        return [], (), False
    fence = "phase_one_term" not in unsafe
    futures: list[Future[None]] = []
    ids: list[int] = []
    for meta, _ in streams:
        # Even for a stream this bookie never heard of: its term must be fenced here (a wiped
        # disk forgot it), and its negatives must become UNKNOWN.
        futures.append(storage.set_limbo(meta.id, limbo, term=meta.term if fence else 0))
        ids.append(meta.id)
    return futures, tuple(ids), limbo


async def run_phase_one(
    storage: StreamStorage,
    streams: Sequence[tuple[StreamMeta, Sequence[Fragment]]],
    *,
    reason: str,
    unsafe: UnsafeSkips = SAFE,
) -> PhaseOneReport:
    """Raises the local term of every stream in `streams` to its metadata term and sets limbo,
    and returns once all of it is durable (one journal group commit for many streams). Call on
    the storage's thread, before serving. `unsafe` turns parts off, in tests only."""
    started = time.monotonic()
    if "phase_one" in unsafe:
        log.warning("integrity.phase_one_skipped_unsafe", env=UNSAFE_SKIP_ENV, reason=reason)
        return PhaseOneReport(reason, (), False, 0.0)
    futures, ids, limbo = begin_phase_one(storage, streams, unsafe=unsafe)
    for future in futures:
        await asyncio.wrap_future(future)
    seconds = time.monotonic() - started
    metrics.PHASE_ONE_STREAMS.set(len(ids))
    metrics.PHASE_ONE_SECONDS.set(seconds)
    log.warning(
        "integrity.phase_one_done",
        reason=reason,
        streams=len(ids),
        limbo=limbo,
        seconds=round(seconds, 3),
    )
    return PhaseOneReport(reason, ids, limbo, seconds)


def limbo_bounds(storage: StreamStorage) -> dict[int, int]:
    """Returns {stream id: local term} for every stream in limbo. Taken before serving, the
    local term bounds the terms that may have written entries this bookie lost: at least the
    metadata term phase one saw, hence no lower than any term of the crashed run."""
    bounds = {}
    for stream_id in storage.stream_ids():
        state = storage.stream_state(stream_id)
        if state is not None and state.limbo:
            bounds[stream_id] = state.term
    return bounds


@dataclass(frozen=True)
class BootPreparation:
    """What the boot found before opening the storage."""

    journal_bypassed_before: bool
    cookie_fix: CookieDecision | None


def prepare_boot(config: BookieConfig, decision: CookieDecision) -> BootPreparation:
    """Blocking steps before the storage opens: discards the index when a cookie fix lost a
    directory, and notes (and marks) the journal mode. Returns what phase one needs."""
    fix = decision if decision.action is CookieAction.FIX else None
    if fix is not None:
        discard_index_for_fix(config, fix)
    return BootPreparation(note_journal_mode(config), fix)


async def protect_at_boot(
    config: BookieConfig,
    storage: StreamStorage,
    session: Any,
    cookie_store: CookieStore,
    preparation: BootPreparation,
    *,
    unclean: bool,
    unsafe: UnsafeSkips = SAFE,
) -> dict[int, int]:
    """Runs phase one when needed (streams from the metadata), then writes the fixed cookie
    and settles the journal mode; returns the bounds phase two needs (`limbo_bounds`). Call on
    the storage's thread after it opened and before serving."""
    from stream.metadata.streams import StreamStore

    reason = phase_one_reason(
        unclean=unclean,
        journal_bypassed=preparation.journal_bypassed_before,
        cookie_fix=preparation.cookie_fix is not None,
    )
    if reason is not None:
        streams = await asyncio.to_thread(
            StreamStore(session).streams_with_bookie, config.bookie_id
        )
        await run_phase_one(storage, streams, reason=reason, unsafe=unsafe)
    if preparation.cookie_fix is not None:
        await asyncio.to_thread(_note_forgotten_terms, config, preparation.cookie_fix, session)
        await asyncio.to_thread(apply_cookie_fix, config, preparation.cookie_fix, cookie_store)
    await asyncio.to_thread(settle_journal_mode, config)
    bounds = limbo_bounds(storage)
    metrics.REPAIR_STREAMS_PENDING.set(len(bounds))
    return bounds


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
        storage: StreamStorage,
        metadata: Any,
        transport: BookieTransport,
        options: WriterOptions | None = None,
        rng: random.Random | None = None,
        parallelism: int = REPAIR_PARALLELISM,
        clock: Clock | None = None,
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
        self._flush_every_bytes = max(
            1, min(_FLUSH_EVERY_BYTES, storage.config.write_cache_max_bytes // 4)
        )
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
        started = time.monotonic()
        queue = deque(sorted(bounds))
        metrics.REPAIR_STREAMS_PENDING.set(len(queue))
        log.info("integrity.phase_two_started", streams=len(queue), parallelism=self._parallelism)

        async def worker() -> None:
            while queue:
                stream_id = queue.popleft()
                self.results[stream_id] = await self._repair_stream(stream_id, bounds[stream_id])
                metrics.REPAIR_STREAMS_PENDING.set(len(bounds) - len(self.results))

        await asyncio.gather(*(worker() for _ in range(min(self._parallelism, len(queue)))))
        log.info(
            "integrity.phase_two_done",
            streams=len(self.results),
            copied=sum(r.copied for r in self.results.values()),
            takeovers=sum(1 for r in self.results.values() if r.took_over),
            seconds=round(time.monotonic() - started, 3),
        )
        return self.results

    async def _repair_stream(self, stream_id: int, bound_term: int) -> StreamRepair:
        repair = StreamRepair(stream_id)
        started = time.monotonic()
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
                metrics.REPAIR_FAILED_ATTEMPTS.inc()
                log.info(
                    "integrity.repair_retry",
                    stream_id=stream_id,
                    attempt=repair.attempts,
                    reason=str(e),
                    backoff_s=round(backoff, 3),
                )
            except Exception:  # a bug; keep the stream in limbo and try again later
                metrics.REPAIR_FAILED_ATTEMPTS.inc()
                log.exception("integrity.repair_failed", stream_id=stream_id)
            await asyncio.sleep(backoff * (0.5 + self._rng.random()))
            backoff = min(backoff * 2, _RETRY_BACKOFF_MAX_S)
        repair.seconds = time.monotonic() - started
        metrics.REPAIR_STREAMS.labels(outcome=repair.outcome).inc()
        metrics.REPAIR_STREAM_SECONDS.observe(repair.seconds)
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
        metrics.REPAIR_TAKEOVERS.inc()
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
        metrics.REPAIR_ENTRIES_COPIED.inc(len(entries))
        metrics.REPAIR_BYTES_COPIED.inc(size)
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


def make_repairer(config: BookieConfig, storage: StreamStorage, session: Any) -> Repairer:
    """Returns a Repairer over the bookie's metadata session and a gRPC transport of its own
    (call on the event loop; `Repairer.close` releases them)."""
    from stream.client.grpc_transport import GrpcTransport
    from stream.client.zk_metadata import ZkMetadata

    metadata = ZkMetadata(session)

    async def resolve(bookie_id: str) -> str | None:
        # This bookie may not be registered yet (a killed incarnation's node lingers).
        if bookie_id == config.bookie_id:
            return config.listen
        return await metadata.bookie_address(bookie_id)

    return Repairer(
        bookie_id=config.bookie_id,
        storage=storage,
        metadata=metadata,
        transport=GrpcTransport(resolve, tls=config.client_tls()),
    )


# -- streamctl bookie fix-cookie ------------------------------------------------------------


@dataclass(frozen=True)
class FixCookieReport:
    """What `fix_cookie` did: the cookie decision's action, the problems it fixed, the
    directories whose loss discarded the index, and the streams put in limbo."""

    action: CookieAction
    problems: tuple[str, ...]
    lost_directories: tuple[str, ...]
    limbo_streams: int


@contextlib.contextmanager
def _bookie_stopped(config: BookieConfig) -> Iterator[None]:
    """Holds the bookie's listen address for the duration: a running bookie (which binds it
    exclusively) makes this fail, so that two processes never open one storage."""
    host, _, port = config.listen.rpartition(":")
    sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET)
    # As gRPC does: the stopped bookie's connections in TIME_WAIT must not count, a listener
    # (a running bookie) still does.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        try:
            sock.bind((host.strip("[]"), int(port)))
        except OSError as e:
            raise ConfigError(
                f"cannot bind {config.listen} ({e}): stop the bookie before fixing its cookie",
                key="listen",
            ) from None
        yield
    finally:
        sock.close()


def fix_cookie(config: BookieConfig) -> FixCookieReport:
    """`streamctl bookie fix-cookie`: with the bookie stopped, runs phase one for a repairable
    cookie mismatch and rewrites the cookie; returns what it did (action VERIFIED or
    FIRST_BOOT: nothing to fix). Raises `CookieMismatchError` for a mismatch it must not
    repair, `ConfigError` while the bookie runs."""
    from stream.bookie.storage import StreamStorage
    from stream.metadata.bookies import BookieRegistry
    from stream.metadata.connection import MetadataSession
    from stream.metadata.streams import StreamStore

    with _bookie_stopped(config):
        session = MetadataSession.connect(
            config.metadata,
            timeout_s=config.metadata_connect_timeout_ms / 1000,
            session_timeout_s=config.metadata_session_timeout_ms / 1000,
            auth_file=config.metadata_auth_path,
        )
        try:
            registry = BookieRegistry(session)
            running = registry.available().get(config.bookie_id)
            if running is not None:
                # The address check above misses a bookie running elsewhere or bound to
                # another interface; its registration does not (a fix under a running bookie
                # rewrote its cookie and put its streams in limbo).
                raise ConfigError(
                    f"bookie {config.bookie_id} is registered as available at "
                    f"{running.address}: stop it (or wait for its metadata session to expire, "
                    f"{config.metadata_session_timeout_ms / 1000:g} s after a crash) before "
                    "fixing its cookie",
                    key="bookie_id",
                )
            decision = inspect_cookies(config, session.instance_id(), registry, fixing=True)
            if decision.action is not CookieAction.FIX:
                return FixCookieReport(decision.action, (), (), 0)
            discard_index_for_fix(config, decision)
            streams = StreamStore(session).streams_with_bookie(config.bookie_id)

            async def protect() -> int:
                storage = StreamStorage(config)
                storage.open()
                try:
                    report = await run_phase_one(storage, streams, reason="cookie")
                    await asyncio.to_thread(_note_forgotten_terms, config, decision, session)
                    await asyncio.to_thread(apply_cookie_fix, config, decision, registry)
                except BaseException:
                    storage.abandon()  # the unclean bit stays set: the next boot redoes it
                    raise
                storage.close()
                return len(report.stream_ids)

            limbo = asyncio.run(protect())
        finally:
            session.close()
    return FixCookieReport(decision.action, decision.problems, decision.lost_directories, limbo)


__all__ = [
    "JOURNAL_BYPASS_MARKER",
    "UNSAFE_SKIP_ENV",
    "BootPreparation",
    "FixCookieReport",
    "HoldSpan",
    "PhaseOneReport",
    "Repairer",
    "StreamRepair",
    "fix_cookie",
    "fixed_end",
    "metadata_terms",
    "begin_phase_one",
    "ids_to_hold",
    "limbo_bounds",
    "make_repairer",
    "note_journal_mode",
    "phase_one_reason",
    "plan_copy_runs",
    "prepare_boot",
    "protect_at_boot",
    "run_phase_one",
    "settle_journal_mode",
    "spans_to_hold",
]
