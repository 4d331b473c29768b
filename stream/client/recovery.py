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

`Takeover` runs the steps and retries an attempt; each step lives with its job: 1 and 6 in
`takeover_metadata`, 2 in `fence`, 3-5 in `write_back` (bookie replacement: `bookie_placement`).
All I/O goes through the ports; each protection can be switched off (`Protections`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass

from stream.client.bookie_placement import BookiePlacement, place_ensemble
from stream.client.fence import fence_last_fragment
from stream.client.options import WriterOptions
from stream.client.ports import BookieTransport, MetadataPort, WallClock
from stream.client.producer_tail import last_sequenced_entry, takeover_change
from stream.client.takeover_metadata import TakeoverMetadata, recovered_fragments
from stream.client.takeover_signals import Fenced, RetryLater
from stream.client.timestamps import stamp, timestamp_in_write_set
from stream.client.write_back import WriteBack
from stream.errors import (
    BookieError,
    InvalidTermError,
    NotEnoughBookiesError,
    StreamError,
)
from stream.framing.prepare import NOOP_TRUNCATE, prepare_entry
from stream.logs import get_logger
from stream.metadata.model import (
    AcceptedLoss,
    Fragment,
    ProducerChange,
    StreamMeta,
    WriterInfo,
)
from stream.protocol import FragmentEnsemble
from stream.protocol.producers import TailAnchor

log = get_logger(__name__)

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

        self._commits = TakeoverMetadata(name, metadata=metadata, clock=clock, options=options)

    # ------------------------------------------------------------------ step 1 and retries

    async def run(self) -> TakeoverResult:
        """Returns the reopened stream; raises `InvalidTermError` when a newer writer took
        over meanwhile, `StreamSealedError`, or the last attempt's error once
        `takeover_deadline_s` passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.takeover_deadline_s
        meta, version, last = await self._commits.begin()
        term = meta.term
        identity = self._identity
        await self._metadata.register_writer(
            meta.id, WriterInfo(identity.writer_id, identity.host, identity.pid, term)
        )
        backoff = self._options.retry_backoff_s
        while True:
            try:
                if last is None:
                    return await self._open_fresh(meta, version)
                return await self._recover(meta, version, last)
            except RetryLater as retry:
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
            except Fenced as fenced:
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
        try:
            ensemble = await place_ensemble(self._placement(meta), meta, first - 1, exclude=())
        except NotEnoughBookiesError as e:
            raise RetryLater(e) from None
        fragment = Fragment(first, ensemble, created_ms=self._clock.now_ms())
        producers = self._producer_change(meta, None, first)
        meta, version = await self._commits.finish(meta, version, [], [fragment], first, producers)
        return TakeoverResult(meta, version, meta.term, fragment, first - 1, 0, None)

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
        fencing = await fence_last_fragment(self._transport, meta, last, self._options)
        start, frozen_lac = fencing.start_entry_id, fencing.frozen_lac
        log.info(
            "recovery.fenced",
            stream=self.name,
            term=term,
            start_entry_id=start,
            frozen_lac=frozen_lac,
        )
        write_back = WriteBack(
            self.name,
            transport=self._transport,
            options=self._options,
            placement=self._placement(meta),
            meta=meta,
            last=last,
            start_entry_id=start,
            frozen_lac=frozen_lac,
        )
        operator = self._accept_loss_operator
        accepted: AcceptedLoss | None = None
        try:
            end, written_bytes, last_ts, limbo = await write_back.read_and_write_back(
                start, fencing.sources, accept_loss=operator is not None
            )
            if limbo:
                assert operator is not None  # only an accept-loss recovery gives up limbo
                # Recorded before the no-op gives anything up: a crash in between leaves a
                # record of a loss not made yet, never a loss without a record.
                meta, version, accepted = await self._commits.record_loss(
                    meta, version, end, frozen_lac, limbo, operator
                )
            if last_ts is None:
                last_ts = await self._timestamp_before(meta, last, start)
            if self._protections.truncate_noop:
                last_ts = stamp(self._clock, last_ts)
                noop = prepare_entry(meta.id, end, NOOP_TRUNCATE, last_ts, b"")
                await write_back.add(noop)
                last_entry_id = end
            else:
                noop = None
                last_entry_id = end - 1
            await write_back.wait_written(last_entry_id)
            if noop is not None:
                await write_back.noop_to_whole_ensemble(noop)
            local = write_back.fragments
        finally:
            write_back.close()
        fragments = recovered_fragments(last, local, self._clock.now_ms())
        changed, new, current = fragments.changed, fragments.new, fragments.current
        first_of_term = end
        previous = meta.producer_term
        tail = await self._producer_tail(meta, last, local, last_entry_id)
        producers = self._producer_change(meta, tail, last_entry_id + 1)
        meta, version = await self._commits.finish(
            meta, version, changed, new, first_of_term, producers
        )
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
        local: Sequence[FragmentEnsemble],
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
                FragmentEnsemble(f.first_entry_id, f.ensemble)
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
            raise RetryLater(e) from None

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
        attempt is retried (`RetryLater`): the entry is acknowledged, so its holders answer
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
                raise RetryLater(
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
