"""Taking over a stream: a new term and its recovery (docs/design.md §5 "Taking over", steps 1-6).

1. CAS `meta`: term + 1, IN_RECOVERY; the last fragment's ensemble is captured.
2. `Fence` that ensemble with the new term; proceed at EC positives (`FenceTally`), retry later
   once AQ answered unknown. Start at max(highest LAFR, first entry of the last fragment - 1).
3. Recovery reads forward (`RecoveryReadTally`): one positive recovers, QC explicit negatives
   end, anything else aborts the attempt (retried with backoff, never guessed). The answers
   are gathered fast by `RecoveryReads` (bulk ReadRange when E == WQ, pipelined per-entry
   reads otherwise) and written back a run of entries per flush.
4. Write-backs with the term and the frozen LAC, each to its whole write set; a bookie that
   cannot take one is replaced by an ensemble change kept locally.
5. The NOOP|TRUNCATE entry, to every bookie of the last fragment.
6. CAS `meta`: OPEN, the fragments changed during recovery, the term's first entry id.

All I/O goes through the ports; each protection can be switched off (`Protections`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from stream.client.answers import answer_or_none
from stream.client.options import WriterOptions
from stream.client.pipeline import AddPipeline
from stream.client.ports import AddBatch, BookieTransport, MetadataPort, WallClock
from stream.client.producer_tail import last_sequenced_entry, takeover_change
from stream.client.recovery_reads import BulkSource, RecoveryReads
from stream.client.timestamps import stamp, timestamp_in_write_set
from stream.errors import (
    BadVersionError,
    BookieError,
    EntryTrimmedError,
    InvalidArgumentError,
    InvalidTermError,
    MetadataError,
    NotEnoughBookiesError,
    StreamError,
    StreamInLimboError,
    StreamSealedError,
)
from stream.framing.prepare import NOOP_TRUNCATE, PreparedEntry, prepare_entry, write_back_entry
from stream.metadata.model import (
    AcceptedLoss,
    Fragment,
    ProducerChange,
    StreamMeta,
    StreamState,
    WriterInfo,
)
from stream.protocol import (
    BookieCandidate,
    Code,
    EnsembleChange,
    FenceOutcome,
    FenceTally,
    FragmentEnsemble,
    QuorumConfig,
    RecoveryStatus,
    choose_ensemble,
    choose_replacement,
    ensemble_for,
    journal_required,
    next_to_replace,
    plan_ensemble_change,
    scan_recovery_reads,
)
from stream.protocol.producers import TailAnchor

log = structlog.get_logger(__name__)

T = TypeVar("T")

# Bound on the replacements tried for one failed bookie before the attempt gives up.
_MAX_CANDIDATES_TRIED = 8
# Rounds over the write set to read the timestamp the new term starts from, before falling back
# to the new writer's clock (a lost message must not turn the stream's time back).
_FLOOR_READ_ROUNDS = 4


@dataclass(frozen=True)
class WriterIdentity:
    """Who takes over, as published in the stream's ephemeral `writer` znode."""

    writer_id: str
    host: str = ""
    pid: int = 0


@dataclass(frozen=True)
class TakeoverResult:
    """A stream reopened by a new term: the writer continues after `last_entry_id` (the
    truncate no-op, or the entry before the first one) on `last_fragment`."""

    meta: StreamMeta
    version: int
    term: int
    last_fragment: Fragment
    last_entry_id: int
    # Payload bytes of the entries this recovery wrote into the last fragment (what the
    # writer knows of the fragment's size; earlier terms' are not known).
    written_bytes: int
    # The timestamp of the stream's last entry (the truncate no-op): the next entries are
    # stamped at least this (timestamps never go backwards within a stream). None when the
    # stream has no entry or it could not be read.
    last_timestamp_ms: int | None
    # What an accept-loss recovery gave up (recorded in the meta), None when nothing.
    accepted_loss: AcceptedLoss | None = None
    # The timestamp of `last_fragment`'s first entry; None when it is empty (or unreadable).
    first_timestamp_ms: int | None = None
    # The previous producer term's last sequenced entry, when that term had a producer and
    # wrote one (docs/design.md §11).
    producer_tail: TailAnchor | None = None
    producer_tail_of: str | None = None  # whose term that was


class _RetryLater(Exception):
    """This attempt could not decide (unknown answers); retry after a backoff."""

    def __init__(self, error: StreamError) -> None:
        super().__init__(str(error))
        self.error = error


class _Fenced(Exception):
    """A bookie answered INVALID_TERM during recovery."""

    def __init__(self, bookie_term: int) -> None:
        super().__init__(bookie_term)
        self.bookie_term = bookie_term


async def _cancel_all(tasks: Sequence[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


class _RecoveryOwner:
    """Collects what the recovery pipeline reports."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.invalid_term: int | None = None
        self.error: Exception | None = None
        self.changed = asyncio.Event()

    def on_acknowledged(self, entry_ids: list[int]) -> None:
        pass

    def on_fully_replicated(self) -> None:
        pass

    def on_bookie_failed(self, bookie_id: str, reason: str) -> None:
        self.failed.append(bookie_id)
        self.changed.set()

    def on_invalid_term(self, bookie_id: str, bookie_term: int) -> None:
        self.invalid_term = max(self.invalid_term or 0, bookie_term)
        self.changed.set()

    def on_trimmed(self, bookie_id: str, message: str) -> None:
        self.on_error(
            EntryTrimmedError(
                "the stream was trimmed or deleted during the takeover",
                bookie=bookie_id,
                detail=message,
            )
        )

    def on_error(self, error: Exception) -> None:
        self.error = error
        self.changed.set()


class Takeover:
    """One takeover of one stream by one writer: `run()` returns once the stream is OPEN in
    the new term with its previous term's end fixed."""

    def __init__(
        self,
        name: str,
        *,
        transport: BookieTransport,
        metadata: MetadataPort,
        clock: WallClock,
        rng: random.Random,
        options: WriterOptions,
        identity: WriterIdentity,
        accept_loss_operator: str | None = None,
        producer_id: str | None = None,
    ) -> None:
        """With `accept_loss_operator` (who asked, recorded in the meta), the recovery counts
        limbo UNKNOWNs as absent (docs/design.md §4, `recover --accept-loss`): an entry that no
        bookie holds and that only bookies in limbo could not deny ends the previous term.
        With `producer_id`, the new term is that producer's (docs/design.md §11)."""
        self.name = name
        self._transport = transport
        self._metadata = metadata
        self._clock = clock
        self._rng = rng
        self._options = options
        self._protections = options.protections
        self._identity = identity
        self._accept_loss_operator = accept_loss_operator
        self._producer_id = producer_id

    # ------------------------------------------------------------------ step 1 and retries

    async def run(self) -> TakeoverResult:
        """Returns the reopened stream; raises `InvalidTermError` when a newer writer took
        over meanwhile, `StreamSealedError`, or the last attempt's error once
        `takeover_deadline_s` passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.takeover_deadline_s
        meta, version = await self._metadata.get_stream(self.name)
        for _ in range(self._options.cas_attempts):
            if meta.state is StreamState.SEALED:
                raise StreamSealedError("stream is sealed", stream=self.name)
            try:
                meta, version, last = await self._metadata.begin_takeover(meta.id, version)
                break
            except BadVersionError:
                meta, version = await self._metadata.get_stream(self.name)
        else:
            raise MetadataError("takeover kept losing the metadata CAS", stream=self.name)
        term = meta.term
        log.info(
            "recovery.term_started",
            stream=self.name,
            stream_id=meta.id,
            term=term,
            last_fragment=None if last is None else last.first_entry_id,
        )
        await self._metadata.register_writer(
            meta.id,
            WriterInfo(self._identity.writer_id, self._identity.host, self._identity.pid, term),
        )
        backoff = self._options.retry_backoff_s
        while True:
            try:
                if last is None:
                    return await self._open_fresh(meta, version)
                return await self._recover(meta, version, last)
            except _RetryLater as retry:
                if loop.time() + backoff > deadline:
                    raise retry.error from None
                log.info(
                    "recovery.retry",
                    stream=self.name,
                    term=term,
                    reason=str(retry.error),
                    backoff_s=round(backoff, 3),
                )
                await asyncio.sleep(backoff * (0.5 + self._rng.random()))
                backoff = min(backoff * 2, self._options.retry_backoff_max_s)
            except _Fenced as fenced:
                raise InvalidTermError(
                    "another writer took over during recovery",
                    term=term,
                    current_term=fenced.bookie_term,
                    stream=self.name,
                ) from None

    # ------------------------------------------------------------------ a stream never written

    async def _open_fresh(self, meta: StreamMeta, version: int) -> TakeoverResult:
        """Places the first fragment (new-member truncation first) and opens the stream."""
        first = meta.first_entry_id
        ensemble = await self._place_ensemble(meta, first - 1, exclude=())
        fragment = Fragment(first, ensemble, created_ms=self._clock.now_ms())
        producers = self._producer_change(meta, None, first)
        meta, version = await self._finish(meta, version, [], [fragment], first, producers)
        return TakeoverResult(meta, version, meta.term, fragment, first - 1, 0, None)

    async def _place_ensemble(
        self, meta: StreamMeta, truncate_after: int, exclude: Sequence[str]
    ) -> tuple[str, ...]:
        """Returns a freshly placed ensemble whose members all took the new-member
        truncation (`place_ensemble`); raises `_RetryLater` when not enough bookies answer."""
        try:
            return await place_ensemble(
                self._placement(meta), meta, truncate_after, exclude=exclude
            )
        except NotEnoughBookiesError as e:
            raise _RetryLater(e) from None

    def _placement(self, meta: StreamMeta) -> BookiePlacement:
        return BookiePlacement(
            self.name,
            self._transport,
            self._metadata,
            self._rng,
            self._options,
            term=lambda: meta.term,
        )

    # ------------------------------------------------------------------ steps 2-6

    async def _recover(self, meta: StreamMeta, version: int, last: Fragment) -> TakeoverResult:
        config = meta.quorum
        term = meta.term
        captured = tuple(last.ensemble)
        start, frozen_lac, sources = await self._fence(meta, last)
        log.info(
            "recovery.fenced",
            stream=self.name,
            term=term,
            start_entry_id=start,
            frozen_lac=frozen_lac,
        )
        owner = _RecoveryOwner()
        pipeline = AddPipeline(
            transport=self._transport,
            owner=owner,
            stream_id=meta.id,
            term=term,
            config=config,
            fragments=[FragmentEnsemble(last.first_entry_id, captured)],
            last_entry_id=start,
            options=self._options,
            max_in_flight=self._options.window_entries,
            recovery=True,
            fixed_lac=frozen_lac,
        )
        accepted: AcceptedLoss | None = None
        try:
            end, written_bytes, last_ts, limbo = await self._read_and_write_back(
                meta, config, captured, start, pipeline, owner, sources
            )
            if limbo:
                # Recorded before the no-op gives anything up: a crash in between leaves a
                # record of a loss not made yet, never a loss without a record.
                meta, version, accepted = await self._record_loss(
                    meta, version, end, frozen_lac, limbo
                )
            if last_ts is None:
                last_ts = await self._timestamp_before(meta, last, start)
            if self._protections.truncate_noop:
                last_ts = stamp(self._clock, last_ts)
                noop = prepare_entry(meta.id, end, NOOP_TRUNCATE, last_ts, b"")
                await self._wait_room(pipeline, owner, meta)
                pipeline.add(noop)
                pipeline.flush()
                last_entry_id = end
            else:
                noop = None
                last_entry_id = end - 1
            await self._wait_written(pipeline, owner, meta, last_entry_id)
            if noop is not None:
                await self._noop_to_whole_ensemble(pipeline, owner, meta, noop)
            local = list(pipeline.fragments)
        finally:
            pipeline.close()
        changed: list[Fragment] = []
        new: list[Fragment] = []
        now_ms = self._clock.now_ms()
        current = last
        for first, ensemble in local:
            if first == last.first_entry_id:
                if tuple(ensemble) != captured:
                    current = Fragment(first, tuple(ensemble), created_ms=last.created_ms)
                    changed.append(current)
            else:
                current = Fragment(first, tuple(ensemble), created_ms=now_ms)
                new.append(current)
        first_of_term = end
        previous = meta.producer_term
        tail = await self._producer_tail(meta, last, local, last_entry_id)
        producers = self._producer_change(meta, tail, last_entry_id + 1)
        meta, version = await self._finish(meta, version, changed, new, first_of_term, producers)
        log.info(
            "recovery.done",
            stream=self.name,
            term=term,
            recovered=end - start - 1,
            last_entry_id=last_entry_id,
            fragments_changed=len(changed),
            fragments_added=len(new),
        )
        if current.first_entry_id > last.first_entry_id:
            written_bytes = 0  # the write-backs went to an earlier fragment
        first_ts = None
        if current.first_entry_id == last_entry_id:
            first_ts = last_ts  # the fragment starts with the no-op
        elif current.first_entry_id < last_entry_id:
            first_ts = await timestamp_in_write_set(
                self._transport,
                meta.id,
                config,
                current.ensemble,
                current.first_entry_id,
                self._options.recovery_read_timeout_s,
            )
        return TakeoverResult(
            meta,
            version,
            term,
            current,
            last_entry_id,
            written_bytes,
            last_ts,
            accepted,
            first_ts,
            tail,
            None if previous is None else previous.producer_id,
        )

    async def _producer_tail(
        self,
        meta: StreamMeta,
        last: Fragment,
        local: Sequence[tuple[int, Sequence[str]]],
        last_entry_id: int,
    ) -> TailAnchor | None:
        """Returns the previous producer term's last sequenced entry (None when the newest
        producer term wrote none, or there is none): read once, from the recovered end back
        to where that term's entries since its last roll start."""
        previous = meta.producer_term
        if previous is None:
            return None
        fragments = list(local)
        if previous.first_entry_id < last.first_entry_id:
            # Ensemble changes split the fragment the last roll opened: earlier pieces too.
            _, _, known = await self._metadata.get_snapshot(meta.id)
            earlier = [
                (f.first_entry_id, f.ensemble)
                for f in known
                if f.first_entry_id < last.first_entry_id
            ]
            fragments = [*earlier, *fragments]
        end = last_entry_id - 1 if self._protections.truncate_noop else last_entry_id
        try:
            return await last_sequenced_entry(
                self._transport,
                meta,
                fragments,
                previous.first_entry_id,
                end,
                timeout_s=self._options.recovery_read_timeout_s,
            )
        except StreamError as e:
            raise _RetryLater(e) from None

    def _producer_change(
        self, meta: StreamMeta, tail: TailAnchor | None, first_entry_id: int
    ) -> ProducerChange | None:
        return takeover_change(
            meta,
            tail,
            self._producer_id,
            first_entry_id,
            self._clock.now_ms(),
            int(self._options.producer_expiry_s * 1000),
        )

    async def _timestamp_before(self, meta: StreamMeta, last: Fragment, start: int) -> int | None:
        """Returns the timestamp of entry `start`, the last one before the recovered range
        (none was recovered): the floor of the new term's timestamps. From the last fragment,
        or, when that one is empty, from the fragment before (its recorded last timestamp,
        else a read). None when there is no such entry. When no bookie answers with it the
        attempt is retried (`_RetryLater`): the entry is acknowledged, so its holders answer
        once reachable or out of limbo, and stamping by this writer's clock instead could put
        the new term's entries before it in time. Only an accept-loss recovery, which may give
        up what limbo bookies hold, goes on with its clock alone."""
        if start < max(meta.first_entry_id, 0):
            return None
        holder = last
        recorded = None
        if start < last.first_entry_id:
            _, _, fragments = await self._metadata.get_snapshot(meta.id)
            before = [f for f in fragments if f.first_entry_id <= start]
            if not before:
                return None
            holder = before[-1]
            if holder.last_entry_id == start:
                # A fragment closed at a no-op records its last data entry's timestamp.
                recorded = holder.last_timestamp_ms
        for round_ in range(_FLOOR_READ_ROUNDS):
            if round_:
                await asyncio.sleep(self._options.retry_backoff_s * round_)
            found = await timestamp_in_write_set(
                self._transport,
                meta.id,
                meta.quorum,
                holder.ensemble,
                start,
                self._options.recovery_read_timeout_s,
            )
            if found is not None:
                return found
        if recorded is None:
            if self._accept_loss_operator is None:
                raise _RetryLater(
                    BookieError(
                        f"the timestamp of entry {start}, which the new term's entries must "
                        "not go below, could not be read from its bookies",
                        stream=self.name,
                        entry_id=start,
                    )
                )
            log.warning(
                "recovery.last_timestamp_unknown",
                stream=self.name,
                term=meta.term,
                entry_id=start,
            )
        return recorded

    async def _record_loss(
        self, meta: StreamMeta, version: int, end: int, frozen_lac: int, limbo: Sequence[str]
    ) -> tuple[StreamMeta, int, AcceptedLoss]:
        """Records in the meta that this accept-loss recovery ends the previous term before
        `end`, giving up `end` .. what the previous writer could have acknowledged (at most a
        window past the higher of the entry before `end` and the frozen LAC, assuming its
        window was ours); returns the meta, its version and the record."""
        operator = self._accept_loss_operator
        assert operator is not None  # only an accept-loss recovery gets here
        loss = AcceptedLoss(
            term=meta.term,
            first_entry_id=end,
            last_entry_id=max(end - 1, frozen_lac) + self._options.window_entries,
            limbo_bookies=tuple(sorted(limbo)),
            operator=operator,
            at_ms=self._clock.now_ms(),
        )
        log.warning(
            "recovery.loss_accepted",
            stream=self.name,
            term=meta.term,
            first_entry_id=loss.first_entry_id,
            last_entry_id=loss.last_entry_id,
            frozen_lac=frozen_lac,
            limbo_bookies=list(loss.limbo_bookies),
            operator=operator,
        )
        for _ in range(self._options.cas_attempts):
            try:
                meta, version = await self._metadata.record_accepted_loss(meta.id, version, loss)
                return meta, version, loss
            except BadVersionError:
                meta, version, _ = await self._metadata.get_snapshot(meta.id)  # retention
        raise MetadataError("recording the accepted loss kept losing the CAS", stream=self.name)

    async def _fence(self, meta: StreamMeta, last: Fragment) -> tuple[int, int, list[BulkSource]]:
        """Returns (start entry id, frozen LAC, the bookies that answered positively with the
        last entry each holds) once EC of the captured ensemble took the term; raises
        `_RetryLater` once AQ answered unknown, `_Fenced` on INVALID_TERM."""
        config = meta.quorum
        tally = FenceTally(config, last_fragment_first_entry_id=last.first_entry_id)
        timeout_s = self._options.fence_timeout_s
        fencing = self._protections.term_fencing

        async def ask(index: int, bookie_id: str) -> tuple[int, Any]:
            if fencing:
                call = self._transport.fence(bookie_id, meta.id, meta.term, timeout_s=timeout_s)
            else:
                call = self._transport.stream_state(bookie_id, meta.id, timeout_s=timeout_s)
            return index, await answer_or_none(call)

        tasks = [asyncio.ensure_future(ask(i, b)) for i, b in enumerate(last.ensemble)]
        bookie_term = 0
        sources: list[BulkSource] = []
        try:
            for next_done in asyncio.as_completed(tasks):
                index, response = await next_done
                if response is None:
                    code, lac, lafr = None, -1, -1
                else:
                    code, lac, lafr = response.code, response.lac, response.lafr
                    if not fencing and code == Code.NO_SUCH_STREAM:
                        code = Code.OK  # without fencing, "nothing here" is a usable answer
                    if fencing:
                        bookie_term = max(bookie_term, response.bookie_term)
                    if response.code == Code.OK and response.last_entry_id >= 0:
                        # It holds entries up to there: a source for bulk recovery reads.
                        sources.append(BulkSource(last.ensemble[index], response.last_entry_id))
                outcome = tally.on_response(index, code, lac=lac, lafr=lafr)
                if tally.invalid_term_seen:
                    raise _Fenced(bookie_term)
                if outcome is not FenceOutcome.PENDING:
                    break
        finally:
            await _cancel_all(tasks)
        if tally.outcome is not FenceOutcome.COMPLETE:
            raise _RetryLater(
                BookieError(
                    "fencing failed: too many bookies of the last fragment did not answer",
                    stream=self.name,
                    positives=tally.positives,
                    unknowns=tally.unknowns,
                )
            )
        return tally.start_entry_id, tally.frozen_lac, sources

    async def _read_and_write_back(
        self,
        meta: StreamMeta,
        config: QuorumConfig,
        captured: Sequence[str],
        start: int,
        pipeline: AddPipeline,
        owner: _RecoveryOwner,
        sources: Sequence[BulkSource],
    ) -> tuple[int, int, int | None, tuple[str, ...]]:
        """Reads forward from `start + 1` (`RecoveryReads`: bulk ranges and pipelined
        per-entry reads) and writes every recovered entry back, a run of entries per flush;
        returns (id of the first entry found absent, payload bytes written back, last
        timestamp written back, the bookies in limbo whose UNKNOWNs an accept-loss recovery
        counted as absent there: empty unless it gave something up)."""
        reads = RecoveryReads(
            transport=self._transport,
            stream=self.name,
            stream_id=meta.id,
            term=meta.term,
            config=config,
            ensemble=captured,
            options=self._options,
            bulk_sources=sources,
            accept_loss=self._accept_loss_operator is not None,
        )
        scanned = start  # the highest id recovered so far
        written_bytes = 0
        last_ts: int | None = None
        async with contextlib.aclosing(reads.outcomes(start)) as runs:
            async for run in runs:
                newer_term = max(r.newer_term for r in run)
                if newer_term:
                    raise _Fenced(newer_term)
                scan = scan_recovery_reads(scanned, [r.outcome for r in run])
                for read in run[: scan.last_recovered_entry_id - scanned]:
                    assert read.entry is not None  # RECOVERABLE
                    if not pipeline.has_room():
                        pipeline.flush()
                        await self._wait_room(pipeline, owner, meta)
                    pipeline.add(write_back_entry(meta.id, read.entry))
                    written_bytes += len(read.entry.payload)
                    last_ts = read.entry.timestamp_ms
                pipeline.flush()
                scanned = scan.last_recovered_entry_id
                stop = next((r for r in run if r.entry_id == scan.stopped_at_entry_id), None)
                limbo = () if stop is None else stop.limbo
                if scan.status is RecoveryStatus.ENDED:
                    log.info(
                        "recovery.read",
                        stream=self.name,
                        term=meta.term,
                        start_entry_id=start,
                        end_entry_id=scan.truncate_entry_id,
                        bulk_entries=reads.bulk_entries,
                        bulk_requests=reads.bulk_requests,
                        single_reads=reads.single_reads,
                    )
                    return scan.truncate_entry_id, written_bytes, last_ts, limbo
                if scan.status is RecoveryStatus.ABORTED and limbo:
                    # Retried like any unknown (a limbo may still clear: another recovery
                    # completed and the bookie's repair runs), and the error at the deadline.
                    bookies = sorted(limbo)
                    raise _RetryLater(
                        StreamInLimboError(
                            f"the previous term's end cannot be decided: bookies "
                            f"{', '.join(bookies)} are in limbo (they crashed without the "
                            f"journal and may have lost acknowledged entries) and no bookie "
                            f"holds the entry after the last one; give up what they may have "
                            f"lost with `streamctl recover {self.name} --accept-loss`",
                            stream=self.name,
                            entry_id=scan.stopped_at_entry_id,
                            bookies=tuple(bookies),
                        )
                    )
                if scan.status is RecoveryStatus.ABORTED:
                    raise _RetryLater(
                        BookieError(
                            "recovery read could not decide (unknown answers)",
                            stream=self.name,
                            entry_id=scan.stopped_at_entry_id,
                        )
                    )
        raise _RetryLater(BookieError("recovery reads ended undecided", stream=self.name))

    # ------------------------------------------------------------------ write-back waiting

    def _check_owner(self, owner: _RecoveryOwner) -> None:
        if owner.error is not None:
            raise owner.error
        if owner.invalid_term is not None:
            raise _Fenced(owner.invalid_term)

    async def _wait_room(self, pipeline: AddPipeline, owner: _RecoveryOwner, meta: Any) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.add_timeout_s * 2
        while not pipeline.has_room():
            self._check_owner(owner)
            await self._handle_failures(pipeline, owner, meta)
            if loop.time() > deadline:
                raise _RetryLater(BookieError("recovery write-backs stalled", stream=self.name))
            await pipeline.wait_progress(0.05)

    async def _wait_written(
        self, pipeline: AddPipeline, owner: _RecoveryOwner, meta: StreamMeta, last_entry_id: int
    ) -> None:
        """Returns once every write-back up to `last_entry_id` reached its whole write set (or
        AQ with `recovery_write_quorum` off), replacing failed bookies locally."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.add_timeout_s * 2
        whole = self._protections.recovery_write_quorum
        while (pipeline.lafr if whole else pipeline.lac) < last_entry_id:
            self._check_owner(owner)
            await self._handle_failures(pipeline, owner, meta)
            if loop.time() > deadline:
                raise _RetryLater(
                    BookieError(
                        "recovery write-backs did not reach their write sets",
                        stream=self.name,
                        lafr=pipeline.lafr,
                        last_entry_id=last_entry_id,
                    )
                )
            owner.changed.clear()
            progress = asyncio.ensure_future(pipeline.wait_progress(0.1))
            change = asyncio.ensure_future(owner.changed.wait())
            try:
                await asyncio.wait([progress, change], return_when=asyncio.FIRST_COMPLETED)
            finally:
                await _cancel_all([progress, change])
        self._check_owner(owner)

    async def _handle_failures(
        self, pipeline: AddPipeline, owner: _RecoveryOwner, meta: StreamMeta
    ) -> None:
        """Replaces the failed bookies of the local ensemble (kept locally until step 6)."""
        if not self._protections.recovery_write_quorum:
            owner.failed.clear()  # AQ is enough; failed bookies are left out
            return
        while owner.failed:
            pinned = pipeline.pending.pinned_bookies()
            failed = replacement_choice(pipeline.ensemble, owner.failed, pinned, self._options)
            if failed is None:
                owner.failed.clear()  # none of them is in the ensemble any more
                return
            await self._replace_locally(pipeline, owner, meta, failed, pipeline.lafr)
            owner.failed.remove(failed)

    async def _replace_locally(
        self,
        pipeline: AddPipeline,
        owner: _RecoveryOwner,
        meta: StreamMeta,
        failed: str,
        truncate_after: int,
    ) -> None:
        """Replaces `failed` in the local ensemble (kept locally until step 6): a fragment
        starting at LAFR + 1, the replacement truncated (at `truncate_after` at most) first and
        then sent the moved entries."""

        def moot() -> bool:
            self._check_owner(owner)  # raises when the recovery attempt is over
            return False

        try:
            replaced = await replace_bookie(
                pipeline,
                failed,
                owner.failed,
                self._placement(meta),
                ack_quorum=meta.ack_quorum,
                moot=moot,
                truncate_at_most=truncate_after,
            )
        except NotEnoughBookiesError as e:
            raise _RetryLater(e) from None
        if replaced is not None:
            pipeline.unblock(replaced[1])

    async def _noop_to_whole_ensemble(
        self, pipeline: AddPipeline, owner: _RecoveryOwner, meta: StreamMeta, noop: PreparedEntry
    ) -> None:
        """Sends the truncate no-op to the bookies of the last fragment outside its write set;
        one that does not take it is replaced by a fragment starting after the no-op."""
        config = meta.quorum
        # Members that took the no-op, and replacements that joined after it (truncated at it).
        done: set[str] = set()
        attempts = 0
        while True:
            noop_ensemble = ensemble_for(pipeline.fragments, noop.entry_id)
            write_set = config.write_set_bookies(noop_ensemble, noop.entry_id)
            extras = [b for b in pipeline.ensemble if b not in write_set and b not in done]
            if not extras:
                return
            attempts += 1
            if attempts > _MAX_CANDIDATES_TRIED:
                raise _RetryLater(
                    BookieError("the truncate no-op did not reach the ensemble", stream=self.name)
                )
            futures = [pipeline.send_extra(b, noop) for b in extras]
            answers = await asyncio.gather(
                *(answer_or_none(asyncio.wait_for(f, self._options.add_timeout_s)) for f in futures)
            )
            for bookie_id, answer in zip(extras, answers, strict=True):
                code = None if answer is None or not answer.codes else answer.codes[0]
                if code == Code.OK:
                    done.add(bookie_id)
                    continue
                if answer is not None and code == Code.INVALID_TERM:
                    raise _Fenced(max(answer.bookie_term, meta.term + 1))
                if not self._protections.recovery_write_quorum:
                    done.add(bookie_id)  # left out
                    continue
                pipeline.fail_bookie(bookie_id, "did not take the truncate no-op")
                owner.failed.clear()
                before = set(pipeline.ensemble)
                # LAFR is the no-op now: the new fragment starts right after it.
                await self._replace_locally(pipeline, owner, meta, bookie_id, noop.entry_id)
                done.update(set(pipeline.ensemble) - before)

    # ------------------------------------------------------------------ step 6

    async def _finish(
        self,
        meta: StreamMeta,
        version: int,
        changed: list[Fragment],
        new: list[Fragment],
        first_of_term: int,
        producers: ProducerChange | None = None,
    ) -> tuple[StreamMeta, int]:
        """CASes the stream OPEN with the recovery's fragments (and what it records of
        producers); rereads and retries when a same-term change (retention) moved the version
        first."""
        term = meta.term
        for _ in range(self._options.cas_attempts):
            try:
                return await self._metadata.finish_recovery(
                    meta.id, version, term, changed, new, first_of_term, producers
                )
            except BadVersionError:
                meta, version, _ = await self._metadata.get_snapshot(meta.id)
                if meta.term != term:
                    raise InvalidTermError(
                        "another writer took over during recovery",
                        term=term,
                        current_term=meta.term,
                        stream=self.name,
                    ) from None
        raise MetadataError("finishing the recovery kept losing the CAS", stream=self.name)


def pick_replacement(
    pipeline: AddPipeline,
    failed: str,
    candidates: Sequence[BookieCandidate],
    rng: random.Random,
    tried: Collection[str],
    ack_quorum: int,
    options: WriterOptions,
) -> str:
    """Chooses the bookie to take `failed`'s place in `pipeline`'s ensemble: never a failed
    one nor one `tried` already, never one replaced away by a change the metadata does not
    hold yet (`AddPipeline.unstored_away`), a quarantined one only when nothing else
    qualifies, and one with the journal on when the ack quorum requires it. Raises
    `NotEnoughBookiesError`."""
    ensemble = pipeline.ensemble
    exclude = {*pipeline.failed, *tried}
    if options.protections.spare_holders:
        exclude |= pipeline.unstored_away

    def choose(exclude: set[str]) -> str:
        return choose_replacement(
            ensemble,
            ensemble.index(failed),
            candidates,
            rng,
            exclude=exclude,
            needs_journal=journal_required(ack_quorum),
        )

    try:
        return choose(exclude=exclude | pipeline.quarantined)
    except NotEnoughBookiesError:
        if pipeline.quarantined <= exclude:
            raise
    return choose(exclude=exclude)


@dataclass(frozen=True)
class BookiePlacement:
    """What placing or replacing bookies needs: the stream's name (for errors), the ports, and
    the term the new-member truncations carry, read at each send (the writer's current one)."""

    stream: str
    transport: BookieTransport
    metadata: MetadataPort
    rng: random.Random
    options: WriterOptions
    term: Callable[[], int]


async def replace_bookie(
    pipeline: AddPipeline,
    failed: str,
    failed_bookies: Collection[str],
    how: BookiePlacement,
    *,
    ack_quorum: int,
    moot: Callable[[], bool],
    truncate_at_most: int | None = None,
) -> tuple[EnsembleChange, str] | None:
    """Replaces `failed` in `pipeline`'s ensemble, the one loop of the writer's ensemble change
    and the recovery's local one: waits while it is pinned (it acked entries not yet at WQ),
    picks a replacement, truncates it after LAFR (or `truncate_at_most`) and applies the change
    to the pipeline; returns the change and the replacement, which gets no entries until the
    caller unblocks it (the writer first commits the change by CAS). Returns None when the
    pipeline should replace another failed bookie of `failed_bookies` first, when `failed`
    left the ensemble, or once `moot()` (the caller moved on; it may raise instead). Raises
    `NotEnoughBookiesError` past `ensemble_change_deadline_s` or `_MAX_CANDIDATES_TRIED`
    replacements tried, `_Fenced` when a replacement knows a newer term."""
    options = how.options
    loop = asyncio.get_running_loop()
    deadline = loop.time() + options.ensemble_change_deadline_s
    tried: set[str] = set()
    while True:
        if moot():
            return None
        if loop.time() > deadline or len(tried) >= _MAX_CANDIDATES_TRIED:
            raise NotEnoughBookiesError(
                "no bookie can replace a failed one",
                stream=how.stream,
                bookie=failed,
                ensemble=list(pipeline.ensemble),
            )
        pinned = pipeline.pending.pinned_bookies()
        if failed in pinned:
            if replacement_choice(pipeline.ensemble, failed_bookies, pinned, options) != failed:
                return None  # another failed bookie can be replaced now: that one first
            # It acked committed entries not yet at WQ: wait for them to get there.
            await pipeline.wait_progress(0.05)
            continue
        if failed not in pipeline.ensemble:
            return None  # an earlier change already replaced it
        candidates = await how.metadata.available_bookies()
        try:
            replacement = pick_replacement(
                pipeline, failed, candidates, how.rng, tried, ack_quorum, options
            )
        except NotEnoughBookiesError:
            await asyncio.sleep(options.retry_backoff_s)
            continue
        tried.add(replacement)
        after = pipeline.lafr if truncate_at_most is None else min(truncate_at_most, pipeline.lafr)
        refused = await truncate_members(
            how.transport,
            pipeline.stream_id,
            how.term(),
            [replacement],
            after,
            options,
            enabled=options.protections.new_member_truncation,
        )
        if refused or pipeline.closed:
            continue  # a closed pipeline: the check at the top says what the caller wants
        pinned = pipeline.pending.pinned_bookies()
        change = plan_ensemble_change(
            pipeline.fragments, failed, replacement, lafr=pipeline.lafr, pinned=pinned
        )
        if change is None:
            continue
        pipeline.apply_change(change)
        return change, replacement


async def place_ensemble(
    how: BookiePlacement,
    meta: StreamMeta,
    truncate_after: int,
    *,
    exclude: Collection[str] = (),
    members: Collection[str] = (),
) -> tuple[str, ...]:
    """Returns a freshly placed ensemble for `meta` (never a bookie of `exclude`) whose joining
    bookies (those not in `members`, which hold their state already) all took the new-member
    truncation after `truncate_after`; a bookie that refuses is left out of the next
    try. Raises `NotEnoughBookiesError` when too few bookies qualify or after
    `_MAX_CANDIDATES_TRIED` tries, `_Fenced` when one knows a newer term."""
    excluded = set(exclude)
    for _ in range(_MAX_CANDIDATES_TRIED):
        candidates = await how.metadata.available_bookies()
        ensemble = choose_ensemble(
            candidates,
            meta.ensemble,
            how.rng,
            exclude=excluded,
            needs_journal=journal_required(meta.ack_quorum),
        )
        refused = await truncate_members(
            how.transport,
            meta.id,
            how.term(),
            [b for b in ensemble if b not in members],
            truncate_after,
            how.options,
            enabled=how.options.protections.new_member_truncation,
        )
        if not refused:
            return ensemble
        excluded.update(refused)
    raise NotEnoughBookiesError(
        "bookies refused to join a new fragment (the new-member truncation)", stream=how.stream
    )


def replacement_choice(
    ensemble: Sequence[str],
    failed: Collection[str],
    pinned: Collection[str],
    options: WriterOptions,
) -> str | None:
    """Returns the failed bookie of `ensemble` to replace next (`next_to_replace`: an unpinned
    one first), or None; in plain ensemble order with `replace_unpinned_first` off."""
    if not options.protections.replace_unpinned_first:
        pinned = ()
    return next_to_replace(ensemble, failed, pinned)


async def truncate_members(
    transport: BookieTransport,
    stream_id: int,
    term: int,
    bookies: Sequence[str],
    after_entry_id: int,
    options: WriterOptions,
    *,
    enabled: bool,
) -> list[str]:
    """Sends the new-member truncation `Truncate(after_entry_id)` with `term` to `bookies` in
    parallel; returns those that did not take it (an INVALID_TERM raises `_Fenced`)."""
    if not enabled or not bookies:
        return []
    answers = await asyncio.gather(
        *(
            answer_or_none(
                transport.truncate(
                    b, stream_id, term, after_entry_id, timeout_s=options.truncate_timeout_s
                )
            )
            for b in bookies
        )
    )
    refused = []
    for bookie_id, answer in zip(bookies, answers, strict=True):
        if answer is not None and answer.code == Code.INVALID_TERM:
            raise _Fenced(answer.bookie_term)
        if answer is None or answer.code != Code.OK:
            log.warning(
                "writer.truncate_refused",
                bookie=bookie_id,
                stream_id=stream_id,
                code=None if answer is None else Code(answer.code).name,
            )
            refused.append(bookie_id)
    return refused


async def send_lac(
    transport: BookieTransport,
    stream_id: int,
    term: int,
    ensemble: Sequence[str],
    lac: int,
    timeout_s: float,
) -> None:
    """Sends an explicit LAC (an empty add) to every bookie of `ensemble`, best effort."""

    async def one(bookie_id: str) -> None:
        stream = transport.open_add_stream(bookie_id)
        try:
            await asyncio.wait_for(
                stream.send(AddBatch(stream_id=stream_id, term=term, lac=lac, lafr=lac)),
                timeout_s,
            )
        finally:
            stream.close()

    await asyncio.gather(*(answer_or_none(one(b)) for b in ensemble))


async def _take_over_publishing_lac(
    takeover: Takeover, transport: BookieTransport, options: WriterOptions
) -> TakeoverResult:
    """Runs `takeover` and publishes its recovered LAC to the last ensemble, for a takeover
    that opens no writer (a seal, an accept-loss recovery): readers see the end at once."""
    result = await takeover.run()
    await send_lac(
        transport,
        result.meta.id,
        result.term,
        result.last_fragment.ensemble,
        result.last_entry_id,
        options.add_timeout_s,
    )
    return result


async def seal(
    name: str,
    *,
    transport: BookieTransport,
    metadata: MetadataPort,
    clock: WallClock,
    rng: random.Random,
    options: WriterOptions,
    identity: WriterIdentity,
) -> StreamMeta:
    """Runs a takeover (the recovery fixes the end), publishes the final LAC to the last
    ensemble, then CASes the stream SEALED; returns the sealed meta."""
    result = await _take_over_publishing_lac(
        Takeover(
            name,
            transport=transport,
            metadata=metadata,
            clock=clock,
            rng=rng,
            options=options,
            identity=identity,
        ),
        transport,
        options,
    )
    meta, version = result.meta, result.version
    for _ in range(options.cas_attempts):
        try:
            meta, _ = await metadata.set_state(meta.id, version, StreamState.SEALED)
            break
        except BadVersionError:
            meta, version, _ = await metadata.get_snapshot(meta.id)
            if meta.term != result.term:
                raise InvalidTermError(
                    "another writer took over before the stream was sealed",
                    term=result.term,
                    current_term=meta.term,
                    stream=name,
                ) from None
    else:
        raise MetadataError("sealing kept losing the CAS", stream=name)
    await metadata.unregister_writer(meta.id)
    log.info("recovery.sealed", stream=name, term=result.term, last_entry_id=result.last_entry_id)
    return meta


@dataclass(frozen=True)
class BookieLimboState:
    """What one bookie of the last fragment said of the stream (`StreamState`, no term)."""

    bookie_id: str
    reachable: bool
    limbo: bool = False
    last_entry_id: int = -1  # highest entry id it holds (-1: none)
    lac: int = -1


@dataclass(frozen=True)
class LossSurvey:
    """What an accept-loss recovery of `stream` would give up, as seen before it runs: the
    previous term would end after `last_held_entry_id` (the last entry some reachable bookie of
    the last fragment holds), so the entries `first_at_risk` .. `last_at_risk` (a bound: what
    the previous writer could have acknowledged, assuming its window was this client's) may
    be lost; those up to `lac` were certainly acknowledged."""

    stream: str
    term: int
    state: str
    bookies: tuple[BookieLimboState, ...]
    last_held_entry_id: int
    lac: int
    first_at_risk: int
    last_at_risk: int

    @property
    def limbo_bookies(self) -> tuple[str, ...]:
        """Returns the reachable bookies of the last fragment that are in limbo."""
        return tuple(b.bookie_id for b in self.bookies if b.limbo)

    @property
    def unreachable_bookies(self) -> tuple[str, ...]:
        """Returns the bookies of the last fragment that did not answer."""
        return tuple(b.bookie_id for b in self.bookies if not b.reachable)


async def survey_loss(
    name: str, *, transport: BookieTransport, metadata: MetadataPort, options: WriterOptions
) -> LossSurvey:
    """Asks every bookie of the stream's last fragment what it holds and whether it is in limbo
    (term-less requests: nothing changes) and returns what an accept-loss recovery would give
    up. Raises `StreamSealedError` for a sealed stream."""
    meta, _ = await metadata.get_stream(name)
    if meta.state is StreamState.SEALED:
        raise StreamSealedError("stream is sealed", stream=name)
    _, _, fragments = await metadata.get_snapshot(meta.id)
    ensemble = fragments[-1].ensemble if fragments else ()
    answers = await asyncio.gather(
        *(
            answer_or_none(transport.stream_state(b, meta.id, timeout_s=options.fence_timeout_s))
            for b in ensemble
        )
    )
    states: list[BookieLimboState] = []
    for bookie_id, answer in zip(ensemble, answers, strict=True):
        if answer is None or answer.code not in (Code.OK, Code.NO_SUCH_STREAM):
            states.append(BookieLimboState(bookie_id, reachable=False))
        elif answer.code == Code.NO_SUCH_STREAM:
            states.append(BookieLimboState(bookie_id, reachable=True))
        else:
            states.append(
                BookieLimboState(bookie_id, True, answer.limbo, answer.last_entry_id, answer.lac)
            )
    last_held = max((b.last_entry_id for b in states), default=-1)
    last_held = max(last_held, meta.first_entry_id - 1)
    lac = max((b.lac for b in states), default=-1)
    return LossSurvey(
        stream=name,
        term=meta.term,
        state=str(meta.state),
        bookies=tuple(states),
        last_held_entry_id=last_held,
        lac=lac,
        first_at_risk=last_held + 1,
        last_at_risk=max(last_held, lac) + options.window_entries,
    )


async def recover_accepting_loss(
    name: str,
    *,
    transport: BookieTransport,
    metadata: MetadataPort,
    clock: WallClock,
    rng: random.Random,
    options: WriterOptions,
    identity: WriterIdentity,
    operator: str,
) -> TakeoverResult:
    """The way out of a stuck limbo (docs/design.md §4, `streamctl recover --accept-loss`): runs a
    takeover whose recovery counts limbo UNKNOWNs as absent, so that it ends the previous term
    after the last entry some reachable bookie still holds; records what it gave up and who
    asked (`operator`) in the meta first; publishes the recovered LAC and leaves the stream
    OPEN with no writer. The bookies' repairs (phase two) then clear their limbo. The result's
    `accepted_loss` is None when no limbo stood in the way (nothing was given up)."""
    if not isinstance(operator, str) or not operator:
        raise InvalidArgumentError("operator must be a non-empty str", stream=name)
    result = await _take_over_publishing_lac(
        Takeover(
            name,
            transport=transport,
            metadata=metadata,
            clock=clock,
            rng=rng,
            options=options,
            identity=identity,
            accept_loss_operator=operator,
        ),
        transport,
        options,
    )
    await metadata.unregister_writer(result.meta.id)
    log.info(
        "recovery.accept_loss_done",
        stream=name,
        term=result.term,
        last_entry_id=result.last_entry_id,
        gave_up=result.accepted_loss is not None,
        operator=operator,
    )
    return result


async def close_after_takeover(
    *,
    transport: BookieTransport,
    metadata: MetadataPort,
    result: TakeoverResult,
    closed: Fragment,
    fresh: Fragment,
    options: WriterOptions,
) -> bool:
    """After a takeover that left its no-op in the last fragment: CASes `closed` (that
    fragment, with `last_entry_id` = the no-op) and opens `fresh` (empty, right after it), as
    a capacity roll does. Members of `fresh` that were not in `closed` get the new-member
    truncation first. Returns False when another writer took over meanwhile (the stream is
    its own then) or a member refused the truncation; rereads and retries a same-term CAS
    loss (retention, a worker's repair)."""
    newcomers = [b for b in fresh.ensemble if b not in closed.ensemble]
    try:
        refused = await truncate_members(
            transport,
            result.meta.id,
            result.term,
            newcomers,
            closed.last_entry_id if closed.last_entry_id is not None else fresh.first_entry_id - 1,
            options,
            enabled=options.protections.new_member_truncation,
        )
    except _Fenced:
        return False
    if refused:
        return False
    version = result.version
    for _ in range(options.cas_attempts):
        try:
            await metadata.roll_fragment(result.meta.id, version, closed, fresh)
            return True
        except BadVersionError:
            meta, version, fragments = await metadata.get_snapshot(result.meta.id)
            if (
                meta.term != result.term
                or not fragments
                or fragments[-1].first_entry_id != closed.first_entry_id
            ):
                return False
    return False
