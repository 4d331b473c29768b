"""Replication workers (docs/design.md §7): take an under-replication marker with an ephemeral lock,
copy the share of the fragment that each named bookie held (by write set) from the surviving
copies to a chosen bookie, check it landed, CAS the fragment's ensemble, drop the marker.

How a copy is written: adds to the target bookie at the stream's current term, flagged
`recovery` (so they are journaled even on a journal-less bookie, and served by a read-only
one), with LAC/LAFR -1 (they move nothing). The term only fences: a bookie term at the
stream's term is what a takeover would leave. Every id of the share is written, so an older
value the target may hold at one of them (an earlier term's unacknowledged entry) is
overwritten before metadata names the target; ids outside the share are never read from it.
An earlier term's NOOP|TRUNCATE goes as a plain NOOP (as in a recovery write-back): the target
may hold later fragments of the stream.

No new-member truncation here, unlike a writer's ensemble change: the fragment is closed and
the target may be a member of later fragments, whose entries a truncation would delete.

A worker that dies mid-copy loses its lock with its session; the marker stays for another.
Two workers never copy one marker at once (the lock), and the CAS checks the `meta` version,
so a fragment that changed meanwhile is planned again, never overwritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from stream.autorecovery import metrics
from stream.autorecovery.settings import AutoRecoverySettings
from stream.client.ports import AddBatch, AddStream, BookieTransport, answered_ids
from stream.client.zk_metadata import ZkMetadata
from stream.clock import Clock, SystemClock
from stream.errors import NotEnoughBookiesError, StreamError, StreamNotFoundError
from stream.framing.prepare import write_back_entry
from stream.framing.verify import checksum_ok, good_run
from stream.logs import get_logger
from stream.metadata import BadVersionError, Fragment, StreamMeta, StreamState
from stream.metadata.underreplication import LockInfo, Marker, UnderreplicationStore
from stream.protocol import Code, choose_replacement, journal_required
from stream.protocol.rereplication import (
    FragmentView,
    fragment_bounds,
    plan_copy_runs,
    replacement_ensemble,
    share_ends,
)
from stream.wakeup import wake
from stream.wire import bookie_pb2 as pb

log = get_logger(__name__)

# Ids planned per pass over a share; payload bytes per copy batch; batches in flight to the
# target; copy runs read at once (a striped ensemble gives many short runs).
_WINDOW_IDS = 65_536
_COPY_BATCH_BYTES = 512 << 10
_MAX_IN_FLIGHT = 4
_PARALLEL_RUNS = 8
# A TOO_BUSY target (write cache full) is asked again after this, this many times.
_BUSY_BACKOFF_S = 0.2
_BUSY_RETRIES = 50
# After a failed attempt a marker is left alone this long (doubling up to the cap); a marker
# of an open fragment is looked at again after the first value.
_RETRY_S = 2.0
_RETRY_MAX_S = 60.0
# Workers list the markers again at least this often (a dead worker's lock expires silently).
_POLL_S = 5.0
_PROGRESS_EVERY_S = 1.0
_CAS_ATTEMPTS = 16


class ReplicationFailed(StreamError):
    """This attempt could not finish; the marker stays for a later one."""


@dataclass
class Progress:
    """What one worker copied (all markers), and for the marker at hand."""

    entries: int = 0
    bytes: int = 0
    fragments: int = 0


class ReplicationWorker:
    """One replication worker; `run()` works markers until `stop()`."""

    def __init__(
        self,
        *,
        metadata: ZkMetadata,
        transport: BookieTransport,
        settings: AutoRecoverySettings,
        identifier: str,
        rng: random.Random | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._metadata = metadata
        self._clock = clock or SystemClock()
        self._store = UnderreplicationStore(metadata.session)
        self._transport = transport
        self._settings = settings
        self.identifier = identifier
        self._rng = rng or random.Random()
        self._stopping = False
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._retry_at: dict[str, tuple[float, float]] = {}
        self.total = Progress()
        self.outcomes: dict[str, int] = {}

    def stop(self) -> None:
        self._stopping = True
        self.wake_up()

    def wake_up(self) -> None:
        """Makes the worker list the markers now (thread-safe)."""
        wake(self._loop, self._wake)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        log.info("autorecovery.worker_started", worker=self.identifier)
        while not self._stopping:
            self._wake.clear()
            try:
                worked = await self.work_once()
            except StreamError as e:
                log.warning("autorecovery.worker_pass_failed", error=str(e))
                worked = False
            if worked or self._stopping:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _POLL_S)
        log.info("autorecovery.worker_stopped", worker=self.identifier, **self.outcomes)

    async def work_once(self) -> bool:
        """Takes one marker that is free and due, works it; returns whether it found one."""
        names = await asyncio.to_thread(self._store_names)
        self._rng.shuffle(names)
        now = self._clock.monotonic()
        for name in names:
            if self._stopping:
                return False
            due = self._retry_at.get(name)
            if due is not None and now < due[0]:
                continue
            info = LockInfo(owner=self.identifier)
            if not await asyncio.to_thread(self._store.try_lock, name, info):
                continue
            try:
                outcome = await self._work(name)
            finally:
                with contextlib.suppress(StreamError):
                    await asyncio.to_thread(self._store.unlock, name)
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            metrics.MARKERS_WORKED.labels(outcome=outcome).inc()
            if outcome in ("failed", "open"):
                backoff = _RETRY_S if due is None or outcome == "open" else due[1] * 2
                backoff = min(backoff, _RETRY_MAX_S)
                self._retry_at[name] = (self._clock.monotonic() + backoff, backoff)
            else:
                self._retry_at.pop(name, None)
            return True
        return False

    def _store_names(self) -> list[str]:
        return [m.name for m in self._store.markers()]

    async def _work(self, name: str) -> str:
        """Works marker `name` (whose lock we hold) until its fragment names none of its
        bookies; returns the outcome: replicated, whole, gone, open or failed."""
        outcome = "whole"
        for _ in range(4):  # a marker that gained bookies while we copied is worked again
            found = await asyncio.to_thread(self._store.marker_with_version, name)
            if found is None:
                return outcome  # removed meanwhile (the stream was deleted)
            marker, marker_version = found
            try:
                result = await self.replicate(marker)
            except ReplicationFailed as e:
                log.warning("autorecovery.replication_failed", marker=name, reason=str(e))
                return "failed"
            except StreamError as e:
                log.warning("autorecovery.replication_failed", marker=name, reason=repr(e))
                return "failed"
            if result == "open":
                return result
            if result == "replicated":
                outcome = result
            if await asyncio.to_thread(self._store.unmark, name, marker_version):
                return outcome
        return outcome

    # -- one marker ------------------------------------------------------------------------

    async def replicate(self, marker: Marker) -> str:
        """Copies and CASes until the fragment names none of `marker.bookies`; returns
        replicated, whole (nothing to do), gone (stream or fragment gone) or open (the open
        last fragment: the writer or the auditor's takeover closes it first)."""
        try:
            meta, version, fragments = await self._metadata.get_snapshot(marker.stream_id)
        except StreamNotFoundError:
            return "gone"
        index = next(
            (i for i, f in enumerate(fragments) if f.first_entry_id == marker.first_entry_id),
            None,
        )
        if index is None:
            return "gone"  # trimmed by retention, or merged by a recovery
        fragment = fragments[index]
        replace = [b for b in marker.bookies if b in fragment.ensemble]
        if not replace:
            return "whole"
        bounds = fragment_bounds(
            [FragmentView(f.first_entry_id, f.ensemble, f.last_entry_id) for f in fragments],
            index,
            first_retained=meta.first_entry_id,
            sealed_last=sealed_last(meta),
        )
        if bounds is None:
            return "open"
        started = self._clock.monotonic()
        targets = await self._choose_targets(fragment.ensemble, replace, meta.ack_quorum)
        available = {c.bookie_id for c in await self._metadata.available_bookies()}
        unavailable = {b for b in fragment.ensemble if b not in available} | set(replace)
        first, last = bounds
        progress = Progress()
        log.info(
            "autorecovery.replicating",
            stream=meta.name,
            stream_id=meta.id,
            first_entry_id=fragment.first_entry_id,
            entries=f"{first}..{last}",
            replace=targets,
        )
        for lost, target in targets.items():
            await self._copy_share(
                meta, fragment.ensemble, lost, target, first, last, unavailable, marker, progress
            )
        new = dataclasses.replace(
            fragment, ensemble=replacement_ensemble(fragment.ensemble, targets)
        )
        if not await self._commit(meta, version, fragment, new):
            raise ReplicationFailed("the fragment changed while it was copied")
        self.total.entries += progress.entries
        self.total.bytes += progress.bytes
        self.total.fragments += 1
        metrics.FRAGMENTS_REPLICATED.inc()
        metrics.ENTRIES_COPIED.inc(progress.entries)
        metrics.BYTES_COPIED.inc(progress.bytes)
        log.info(
            "autorecovery.replicated",
            stream=meta.name,
            first_entry_id=fragment.first_entry_id,
            ensemble=list(new.ensemble),
            entries=progress.entries,
            bytes=progress.bytes,
            seconds=round(self._clock.monotonic() - started, 3),
        )
        return "replicated"

    async def _choose_targets(
        self, ensemble: Sequence[str], replace: Sequence[str], ack_quorum: int
    ) -> dict[str, str]:
        """Returns a writable, non-draining bookie outside the ensemble for each of
        `replace`, all distinct, journaled where the ack quorum requires it."""
        candidates = await self._metadata.available_bookies()
        draining = await asyncio.to_thread(self._store.draining)
        targets: dict[str, str] = {}
        for lost in replace:
            try:
                targets[lost] = choose_replacement(
                    ensemble,
                    list(ensemble).index(lost),
                    candidates,
                    self._rng,
                    exclude={*draining, *targets.values()},
                    needs_journal=journal_required(ack_quorum),
                )
            except NotEnoughBookiesError as e:
                raise ReplicationFailed("no bookie to copy to", reason=str(e)) from None
        return targets

    async def _commit(
        self, meta: StreamMeta, version: int, before: Fragment, new: Fragment
    ) -> bool:
        """CASes `new` over `before`; rereads and retries while the fragment itself is
        unchanged (a writer's roll or ensemble change moved the version). False when the
        fragment changed or went."""
        for _ in range(_CAS_ATTEMPTS):
            try:
                await self._metadata.add_fragment(meta.id, version, new, replaces_first_id=True)
                return True
            except BadVersionError:
                meta, version, fragments = await self._metadata.get_snapshot(meta.id)
                # A fixed fragment stays fixed; only the same fragment may be replaced.
                if before not in fragments or before.first_entry_id < meta.first_entry_id:
                    return False
        return False

    # -- the copy --------------------------------------------------------------------------

    async def _copy_share(
        self,
        meta: StreamMeta,
        ensemble: tuple[str, ...],
        lost: str,
        target: str,
        first: int,
        last: int,
        unavailable: set[str],
        marker: Marker,
        progress: Progress,
    ) -> None:
        """Copies the ids `first..last` that `lost`'s index stores to `target`, then reads
        the first and last back from it."""
        if last < first:
            return
        config = meta.quorum
        index = ensemble.index(lost)
        sink = _CopySink(
            self._transport.open_add_stream(target),
            meta,
            timeout_s=self._settings.bookie_timeout_ms / 1000,
            rate_bytes=self._settings.replication_rate_bytes,
            clock=self._clock,
        )
        reporter = _LockReporter(
            self._store, marker.name, self.identifier, target, progress, self._clock
        )
        slots = asyncio.Semaphore(_PARALLEL_RUNS)
        try:
            for window_first in range(first, last + 1, _WINDOW_IDS):
                window_last = min(window_first + _WINDOW_IDS - 1, last)
                ids = list(config.bookie_index_entries(index, window_first, window_last))
                if not ids:
                    continue
                runs = plan_copy_runs(
                    config, ensemble, lost, ids, self._rng, unavailable=unavailable
                )

                async def copy(peers: list[str], a: int, b: int) -> None:
                    async with slots:
                        await self._copy_run(meta, peers, a, b, sink, marker, progress, reporter)

                async with asyncio.TaskGroup() as group:
                    for run in runs:
                        group.create_task(copy(*run))
            await sink.drain()
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None
        finally:
            sink.close()
        await reporter.maybe_report(force=True)
        for entry_id in share_ends(config, index, first, last):
            await self._check_landed(meta, target, entry_id)

    async def _copy_run(
        self,
        meta: StreamMeta,
        peers: list[str],
        first: int,
        last: int,
        sink: _CopySink,
        marker: Marker,
        progress: Progress,
        reporter: _LockReporter,
    ) -> None:
        """Copies `first..last` from the first of `peers` that has them (where one stops, the
        next is asked for the rest); raises ReplicationFailed when none has an entry."""
        position = first
        timeout_s = self._settings.bookie_timeout_ms / 1000
        for peer in peers:
            if position > last:
                break
            try:
                async for response in self._transport.read_range(
                    peer,
                    meta.id,
                    position,
                    last,
                    max_batch_bytes=_COPY_BATCH_BYTES,
                    timeout_s=max(timeout_s, 60.0),
                ):
                    good = good_run(meta.id, position, response.entries)
                    batch = list(response.entries[:good])
                    if batch:
                        await sink.send(batch)
                        position += len(batch)
                        progress.entries += len(batch)
                        progress.bytes += sum(len(e.payload) for e in batch)
                        await reporter.maybe_report()
                    if len(batch) != len(response.entries) or response.code != pb.OK:
                        break
            except ReplicationFailed:
                raise
            except Exception as e:  # an unknown answer: ask the next peer
                log.debug(
                    "autorecovery.copy_read_failed", bookie=peer, entry_id=position, error=repr(e)
                )
        if position <= last:
            raise ReplicationFailed(
                "no surviving copy answered", stream=meta.name, entry_id=position
            )

    async def _check_landed(self, meta: StreamMeta, target: str, entry_id: int) -> None:
        """Reads `entry_id` back from `target` and checks it (id and checksum)."""
        timeout_s = self._settings.bookie_timeout_ms / 1000
        try:
            response = await self._transport.read(target, meta.id, entry_id, timeout_s=timeout_s)
        except Exception as e:
            raise ReplicationFailed("the copy could not be read back", bookie=target) from e
        entry = response.entry
        if response.code != pb.OK or entry.entry_id != entry_id or not checksum_ok(meta.id, entry):
            raise ReplicationFailed(
                "the copy did not read back whole",
                bookie=target,
                entry_id=entry_id,
                code=Code(response.code).name if response.code else None,
            )


def sealed_last(meta: StreamMeta) -> int | None:
    """Returns the id of a sealed stream's final entry (its last truncate no-op), None for a
    stream that is not sealed."""
    if meta.state is not StreamState.SEALED:
        return None
    first = meta.last_term_first_entry_id()
    return first if first is not None else meta.first_entry_id - 1


class _CopySink:
    """Adds of copied entries to the target, a few batches in flight, each checked."""

    def __init__(
        self,
        stream: AddStream,
        meta: StreamMeta,
        *,
        timeout_s: float,
        rate_bytes: int,
        clock: Clock,
    ) -> None:
        self._clock = clock
        self._stream = stream
        self._meta = meta
        self._timeout_s = timeout_s
        self._rate_bytes = rate_bytes
        self._in_flight: deque[tuple[asyncio.Future[pb.AddResponse], AddBatch]] = deque()
        self._started = clock.monotonic()
        self._sent_bytes = 0

    def _batch(self, entries: list[pb.Entry]) -> AddBatch:
        stream_id = self._meta.id
        return AddBatch(
            stream_id=stream_id,
            term=self._meta.term,
            lac=-1,
            lafr=-1,
            recovery=True,
            entries=[write_back_entry(stream_id, e) for e in entries],
        )

    async def send(self, entries: list[pb.Entry]) -> None:
        batch = self._batch(entries)
        self._in_flight.append((self._stream.send(batch), batch))
        while len(self._in_flight) > _MAX_IN_FLIGHT:
            await self._settle_oldest()
        if self._rate_bytes:
            self._sent_bytes += sum(e.payload_bytes for e in batch.entries)
            ahead = self._sent_bytes / self._rate_bytes - (self._clock.monotonic() - self._started)
            if ahead > 0:
                await self._clock.sleep(ahead)

    async def drain(self) -> None:
        while self._in_flight:
            await self._settle_oldest()

    async def _settle_oldest(self) -> None:
        future, batch = self._in_flight.popleft()
        for _ in range(_BUSY_RETRIES):
            try:
                response = await asyncio.wait_for(future, self._timeout_s)
            except Exception as e:
                raise ReplicationFailed("the target did not take the copy", error=repr(e)) from e
            codes = set(response.codes)
            if codes == {pb.OK} and len(answered_ids(response)) == len(batch.entries):
                return
            if codes == {pb.TOO_BUSY} or codes == {pb.OK, pb.TOO_BUSY}:
                await self._clock.sleep(_BUSY_BACKOFF_S)
                future = self._stream.send(batch)  # OK ones are stored again: harmless
                continue
            raise ReplicationFailed(
                "the target refused the copy",
                codes=sorted(Code(c).name for c in codes),
                bookie_term=int(response.bookie_term),
                bookie_message=response.message or None,
            )
        raise ReplicationFailed("the target stayed busy")

    def close(self) -> None:
        for future, _ in self._in_flight:
            future.cancel()
        self._in_flight.clear()
        self._stream.close()


@dataclass
class _LockReporter:
    """Writes the copy's progress into the lock of the marker `name`, at most once a second."""

    store: UnderreplicationStore
    name: str
    owner: str
    target: str
    progress: Progress
    clock: Clock
    last: float = 0.0  # when it last wrote

    async def maybe_report(self, force: bool = False) -> None:
        now = self.clock.monotonic()
        if not force and now - self.last < _PROGRESS_EVERY_S:
            return
        self.last = now
        info = LockInfo(self.owner, self.progress.entries, self.progress.bytes, self.target)
        with contextlib.suppress(StreamError):
            await asyncio.to_thread(self.store.update_lock, self.name, info)
