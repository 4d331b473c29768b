"""Steps 3-5 of a takeover (docs/design.md §5 "Taking over"): read the previous term's tail
forward and write each recovered entry back with the new term and the frozen LAC to its whole
write set, then the truncate no-op to every bookie of the last fragment. A bookie that cannot
take a write-back is replaced by an ensemble change kept locally (committed in step 6)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from stream.client.answers import answers_or_none, cancel_all
from stream.client.bookie_placement import (
    MAX_CANDIDATES_TRIED,
    BookiePlacement,
    replace_bookie,
    replacement_choice,
)
from stream.client.options import WriterOptions
from stream.client.pipeline import AddPipeline
from stream.client.ports import BookieTransport
from stream.client.recovery_reads import BulkSource, RecoveryReads
from stream.client.takeover_signals import Fenced, RetryLater
from stream.errors import (
    BookieError,
    EntryTrimmedError,
    NotEnoughBookiesError,
    StreamInLimboError,
)
from stream.framing.prepare import PreparedEntry, write_back_entry
from stream.logs import get_logger
from stream.metadata.model import Fragment, StreamMeta
from stream.protocol import (
    Code,
    FragmentEnsemble,
    RecoveryStatus,
    ensemble_for,
    scan_recovery_reads,
)

log = get_logger(__name__)


class _RecoveryOwner:
    """Collects what the recovery pipeline reports."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.invalid_term: int | None = None
        self.error: Exception | None = None
        self.changed = asyncio.Event()

    def on_acknowledged(self, entry_ids: range) -> None:
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


class WriteBack:
    """One recovery attempt's write-backs: a recovery pipeline on the last fragment's captured
    ensemble, after `start_entry_id`, carrying the frozen LAC. `close()` it when done."""

    def __init__(
        self,
        name: str,
        *,
        transport: BookieTransport,
        options: WriterOptions,
        placement: BookiePlacement,
        meta: StreamMeta,
        last: Fragment,
        start_entry_id: int,
        frozen_lac: int,
    ) -> None:
        self.name = name
        self._transport = transport
        self._options = options
        self._protections = options.protections
        self._placement = placement
        self._meta = meta
        self._captured = tuple(last.ensemble)
        self._owner = _RecoveryOwner()
        self._pipeline = AddPipeline(
            transport=transport,
            owner=self._owner,
            stream_id=meta.id,
            term=meta.term,
            config=meta.quorum,
            fragments=[FragmentEnsemble(last.first_entry_id, self._captured)],
            last_entry_id=start_entry_id,
            options=options,
            max_in_flight=options.window_entries,
            recovery=True,
            fixed_lac=frozen_lac,
        )

    @property
    def fragments(self) -> list[FragmentEnsemble]:
        """Returns the fragments as changed locally: (first entry id, ensemble) each."""
        return list(self._pipeline.fragments)

    def close(self) -> None:
        self._pipeline.close()

    async def read_and_write_back(
        self, start: int, sources: Sequence[BulkSource], *, accept_loss: bool
    ) -> tuple[int, int, int | None, tuple[str, ...]]:
        """Reads forward from `start + 1` (`RecoveryReads`: bulk ranges and pipelined
        per-entry reads) and writes every recovered entry back, a run of entries per flush;
        returns (id of the first entry found absent, payload bytes written back, last
        timestamp written back, the bookies in limbo whose UNKNOWNs an accept-loss recovery
        counted as absent there: empty unless it gave something up)."""
        meta = self._meta
        pipeline = self._pipeline
        reads = RecoveryReads(
            transport=self._transport,
            stream=self.name,
            stream_id=meta.id,
            term=meta.term,
            config=meta.quorum,
            ensemble=self._captured,
            options=self._options,
            bulk_sources=sources,
            accept_loss=accept_loss,
        )
        scanned = start  # the highest id recovered so far
        written_bytes = 0
        last_ts: int | None = None
        async with contextlib.aclosing(reads.outcomes(start)) as runs:
            async for run in runs:
                newer_term = max(r.newer_term for r in run)
                if newer_term:
                    raise Fenced(newer_term)
                scan = scan_recovery_reads(scanned, [r.outcome for r in run])
                for read in run[: scan.last_recovered_entry_id - scanned]:
                    assert read.entry is not None  # RECOVERABLE
                    if not pipeline.has_room():
                        pipeline.flush()
                        await self.wait_room()
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
                    raise RetryLater(
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
                    raise RetryLater(
                        BookieError(
                            "recovery read could not decide (unknown answers)",
                            stream=self.name,
                            entry_id=scan.stopped_at_entry_id,
                        )
                    )
        raise RetryLater(BookieError("recovery reads ended undecided", stream=self.name))

    async def add(self, entry: PreparedEntry) -> None:
        """Adds `entry` (the truncate no-op) once the pipeline has room, and sends it."""
        await self.wait_room()
        self._pipeline.add(entry)
        self._pipeline.flush()

    # ------------------------------------------------------------------ waiting

    def _check_owner(self) -> None:
        owner = self._owner
        if owner.error is not None:
            raise owner.error
        if owner.invalid_term is not None:
            raise Fenced(owner.invalid_term)

    async def wait_room(self) -> None:
        pipeline = self._pipeline
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.add_timeout_s * 2
        while not pipeline.has_room():
            self._check_owner()
            await self._handle_failures()
            if loop.time() > deadline:
                raise RetryLater(BookieError("recovery write-backs stalled", stream=self.name))
            await pipeline.wait_progress(0.05)

    async def wait_written(self, last_entry_id: int) -> None:
        """Returns once every write-back up to `last_entry_id` reached its whole write set (or
        AQ with `recovery_write_quorum` off), replacing failed bookies locally."""
        pipeline = self._pipeline
        owner = self._owner
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.add_timeout_s * 2
        whole = self._protections.recovery_write_quorum
        while (pipeline.lafr if whole else pipeline.lac) < last_entry_id:
            self._check_owner()
            await self._handle_failures()
            if loop.time() > deadline:
                raise RetryLater(
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
                await cancel_all([progress, change])
        self._check_owner()

    # ------------------------------------------------------------------ local ensemble changes

    async def _handle_failures(self) -> None:
        """Replaces the failed bookies of the local ensemble (kept locally until step 6)."""
        pipeline = self._pipeline
        owner = self._owner
        if not self._protections.recovery_write_quorum:
            owner.failed.clear()  # AQ is enough; failed bookies are left out
            return
        while owner.failed:
            pinned = pipeline.pending.pinned_bookies()
            failed = replacement_choice(pipeline.ensemble, owner.failed, pinned, self._options)
            if failed is None:
                owner.failed.clear()  # none of them is in the ensemble any more
                return
            await self._replace_locally(failed, pipeline.lafr)
            owner.failed.remove(failed)

    async def _replace_locally(self, failed: str, truncate_after: int) -> None:
        """Replaces `failed` in the local ensemble (kept locally until step 6): a fragment
        starting at LAFR + 1, the replacement truncated (at `truncate_after` at most) first and
        then sent the moved entries."""

        def moot() -> bool:
            self._check_owner()  # raises when the recovery attempt is over
            return False

        try:
            replaced = await replace_bookie(
                self._pipeline,
                failed,
                self._owner.failed,
                self._placement,
                ack_quorum=self._meta.ack_quorum,
                moot=moot,
                truncate_at_most=truncate_after,
            )
        except NotEnoughBookiesError as e:
            raise RetryLater(e) from None
        if replaced is not None:
            self._pipeline.unblock(replaced[1])

    async def noop_to_whole_ensemble(self, noop: PreparedEntry) -> None:
        """Sends the truncate no-op to the bookies of the last fragment outside its write set;
        one that does not take it is replaced by a fragment starting after the no-op."""
        pipeline = self._pipeline
        meta = self._meta
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
            if attempts > MAX_CANDIDATES_TRIED:
                raise RetryLater(
                    BookieError("the truncate no-op did not reach the ensemble", stream=self.name)
                )
            futures = [pipeline.send_extra(b, noop) for b in extras]
            answers = await answers_or_none(
                asyncio.wait_for(f, self._options.add_timeout_s) for f in futures
            )
            for bookie_id, answer in zip(extras, answers, strict=True):
                code = None if answer is None or not answer.codes else int(answer.codes[0])
                if code == Code.OK:
                    done.add(bookie_id)
                    continue
                if answer is not None and code == Code.INVALID_TERM:
                    raise Fenced(max(answer.bookie_term, meta.term + 1))
                if not self._protections.recovery_write_quorum:
                    done.add(bookie_id)  # left out
                    continue
                pipeline.fail_bookie(bookie_id, "did not take the truncate no-op")
                self._owner.failed.clear()
                before = set(pipeline.ensemble)
                # LAFR is the no-op now: the new fragment starts right after it.
                await self._replace_locally(bookie_id, noop.entry_id)
                done.update(set(pipeline.ensemble) - before)
