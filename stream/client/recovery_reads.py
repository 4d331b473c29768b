"""The recovery reads of a takeover (docs/design.md §5 step 3), gathered fast and decided by the
rules.

Every entry's outcome is decided by its own `RecoveryReadTally` over its write set in the
captured ensemble: one positive recovers it, QC explicit negatives end the previous term just
before it, anything else is unknown (the attempt aborts and is retried). What makes a takeover
fast is only how the answers are gathered:

- **Bulk** (E == WQ, where every bookie of the ensemble is in every entry's write set): one
  `ReadRange` per chunk from one bookie that answered the fence. Each entry it returns is that
  bookie's positive answer for that entry, which alone makes the entry RECOVERABLE. ReadRange
  carries no term, so where a range stops proves nothing: the stopped-at entry goes to the
  per-entry reads, which carry the term. The next chunk is fetched while the caller writes the
  current one back.
- **Per entry** (striped ensembles, the gaps a bulk source lacks, and the end): term-bearing
  `Read`s of each entry to its write set, many entries in flight at once. One member is asked
  first and the rest only when it did not answer positively (soon enough), so a present entry
  costs one request. The window starts small and doubles per entry decided, up to
  `recovery_read_ahead`, so that reading at the end of the stream (where the first entry
  usually ends it) wastes few requests.

Outcomes come out in id order, in runs (one list per chunk or per batch of reads that
completed), so that the caller writes back many entries per flush.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from stream.client.answers import cancel_all
from stream.client.options import WriterOptions
from stream.client.ports import BookieTransport
from stream.framing.verify import checksum_ok, good_run
from stream.logs import get_logger
from stream.protocol import Code, QuorumConfig, ReadOutcome, RecoveryReadTally, invariant
from stream.wire import bookie_pb2 as pb

log = get_logger(__name__)

_OK = int(Code.OK)


class EntryOutcome:
    """What the recovery reads proved about one entry (a plain slotted class: one is made per
    entry recovered, and a frozen dataclass costs several times more to build)."""

    __slots__ = ("entry_id", "outcome", "entry", "newer_term", "limbo")

    def __init__(
        self,
        entry_id: int,
        outcome: ReadOutcome,
        entry: pb.Entry | None = None,
        newer_term: int = 0,
        limbo: tuple[str, ...] = (),
    ) -> None:
        self.entry_id = entry_id
        self.outcome = outcome
        # The entry to write back (RECOVERABLE only).
        self.entry = entry
        # The highest bookie term seen when a member answered INVALID_TERM (a newer writer
        # exists), else 0.
        self.newer_term = newer_term
        # The bookies in limbo whose UNKNOWNs alone kept this entry undecided (UNKNOWN), or
        # were counted as absent (ENDED, in an accept-loss recovery); else empty.
        self.limbo = limbo

    @property
    def terminal(self) -> bool:
        """Returns whether the scan stops here (the end, an unknown, or a newer term)."""
        return self.outcome is not ReadOutcome.RECOVERABLE or self.newer_term > 0

    def __repr__(self) -> str:
        return (
            f"EntryOutcome({self.entry_id}, {self.outcome.name}, "
            f"entry={self.entry is not None}, newer_term={self.newer_term}, limbo={self.limbo})"
        )


@dataclass(frozen=True, slots=True)
class BulkSource:
    """A bookie of the captured ensemble that answered the fence positively, and the highest
    entry id it said it holds (its ReadRange can return nothing beyond)."""

    bookie_id: str
    last_entry_id: int


@dataclass(slots=True)
class _Chunk:
    """One bulk read: the verified run of entries from `first_entry_id` a source returned, and
    whether the source stopped short (it lacks the next entry, or failed)."""

    source: BulkSource
    first_entry_id: int
    entries: list[pb.Entry]
    stopped: bool


class RecoveryReads:
    """The recovery reads of one takeover attempt: `outcomes(start)` yields the outcomes of
    entries `start + 1`, `start + 2`, ... in id order, in runs, and stops after the first
    terminal one."""

    def __init__(
        self,
        *,
        transport: BookieTransport,
        stream: str,
        stream_id: int,
        term: int,
        config: QuorumConfig,
        ensemble: Sequence[str],
        options: WriterOptions,
        bulk_sources: Sequence[BulkSource] = (),
        accept_loss: bool = False,
    ) -> None:
        invariant(
            len(ensemble) == config.ensemble, "captured ensemble of size E", ensemble=ensemble
        )
        self._transport = transport
        self._stream = stream
        self._stream_id = stream_id
        self._term = term
        self._config = config
        self._ensemble = tuple(ensemble)
        # Write sets by entry id modulo E (a fixed ensemble: the captured one).
        self._write_sets = tuple(
            config.write_set_bookies(self._ensemble, r) for r in range(config.ensemble)
        )
        self._options = options
        # An operator's accept-loss recovery: limbo UNKNOWNs count as absent (docs/design.md §4).
        self._accept_loss = accept_loss
        # Bulk needs every source in every entry's write set: E == WQ.
        striped = config.ensemble != config.write_quorum
        self._sources: list[BulkSource] = (
            []
            if striped
            else sorted(
                (s for s in bulk_sources if s.bookie_id in self._ensemble),
                key=lambda s: -s.last_entry_id,
            )
        )
        # Counters for the log line at the end (and for tests).
        self.bulk_entries = 0
        self.bulk_requests = 0
        self.single_reads = 0

    # ------------------------------------------------------------------ the scan

    async def outcomes(self, start_entry_id: int) -> AsyncGenerator[list[EntryOutcome], None]:
        """Yields runs of consecutive outcomes from `start_entry_id + 1` on; the last outcome
        yielded is the first terminal one. Requests still in flight are cancelled when the
        iteration ends (close it with `contextlib.aclosing`)."""
        next_id = start_entry_id + 1
        # A chunk read ahead: (its first entry id, the read).
        prefetch: tuple[int, asyncio.Task[_Chunk]] | None = None
        try:
            while True:
                source = self._bulk_source(next_id)
                if source is not None:
                    if prefetch is None or prefetch[0] != next_id:
                        if prefetch is not None:
                            await cancel_all([prefetch[1]])
                        prefetch = (next_id, self._start_chunk(source, next_id))
                    chunk = await prefetch[1]
                    prefetch = None
                    if chunk.entries:
                        next_id += len(chunk.entries)
                        following = self._bulk_source(next_id)
                        if not chunk.stopped and following is not None:
                            # Read the next chunk while the caller writes this one back.
                            prefetch = (next_id, self._start_chunk(following, next_id))
                        yield [self._positive(chunk.source, e) for e in chunk.entries]
                        if not chunk.stopped:
                            continue
                    else:
                        # It lacks this very entry (or failed): other sources, if any, later.
                        self._sources.remove(chunk.source)
                # The per-entry reads decide the entry a bulk source lacks and a stretch after
                # it (a source with a hole usually has just one) up to where the sources end,
                # then the bulk goes on; past every source's end, they read to the end.
                sources_end = max((s.last_entry_id for s in self._sources), default=-1)
                stretch = None
                if next_id <= sources_end:
                    stretch = min(self._options.recovery_read_ahead, sources_end - next_id + 1)
                async for run in self._single_reads(next_id, stretch):
                    yield run
                    next_id = run[-1].entry_id + 1
                    if run[-1].terminal:
                        return
        finally:
            if prefetch is not None:
                await cancel_all([prefetch[1]])
            log.debug(
                "recovery.reads_done",
                stream=self._stream,
                term=self._term,
                bulk_entries=self.bulk_entries,
                bulk_requests=self.bulk_requests,
                single_reads=self.single_reads,
            )

    def _bulk_source(self, entry_id: int) -> BulkSource | None:
        """Returns the bulk source to read `entry_id` from, None when no source holds it."""
        for source in self._sources:
            if source.last_entry_id >= entry_id:
                return source
        return None

    def _positive(self, source: BulkSource, entry: pb.Entry) -> EntryOutcome:
        """Returns the outcome of `entry` answered by `source` (a positive: RECOVERABLE)."""
        entry_id = entry.entry_id
        write_set = self._write_sets[entry_id % self._config.ensemble]
        tally: RecoveryReadTally[str, pb.Entry] = RecoveryReadTally(self._config, write_set)
        outcome = tally.on_response(source.bookie_id, _OK, entry)
        invariant(outcome is ReadOutcome.RECOVERABLE, "one positive recovers", entry_id=entry_id)
        return EntryOutcome(entry_id, outcome, tally.entry)

    # ------------------------------------------------------------------ bulk

    def _start_chunk(self, source: BulkSource, first_entry_id: int) -> asyncio.Task[_Chunk]:
        return asyncio.ensure_future(self._read_chunk(source, first_entry_id))

    async def _read_chunk(self, source: BulkSource, first_entry_id: int) -> _Chunk:
        """Returns the run of verified entries from `first_entry_id` that `source` holds, up to
        `recovery_range_entries` entries or about `recovery_range_bytes` of payload."""
        options = self._options
        last = min(source.last_entry_id, first_entry_id + options.recovery_range_entries - 1)
        entries: list[pb.Entry] = []
        expected = first_entry_id
        size = 0
        stopped = True
        self.bulk_requests += 1
        responses = self._transport.read_range(
            source.bookie_id,
            self._stream_id,
            first_entry_id,
            last,
            max_batch_bytes=min(options.recovery_range_bytes, 1 << 20),
            timeout_s=options.recovery_read_timeout_s,
        )
        try:
            async for response in responses:
                good = good_run(self._stream_id, expected, response.entries)
                batch = response.entries[:good]
                entries.extend(batch)
                expected += good
                size += sum(len(entry.payload) for entry in batch)
                bad = good < len(response.entries)
                if bad:
                    # A bad copy proves nothing: the per-entry reads decide this entry.
                    log.warning(
                        "recovery.bad_entry",
                        bookie=source.bookie_id,
                        entry_id=expected,
                        got_entry_id=response.entries[good].entry_id,
                    )
                if bad or response.code != _OK:
                    break  # the range stopped at `expected`: this source lacks it
                if expected > last or size >= options.recovery_range_bytes:
                    stopped = False
                    break
        except asyncio.CancelledError:
            raise
        except Exception as e:  # any failure: what arrived stands, the rest goes per entry
            log.debug("recovery.range_failed", bookie=source.bookie_id, error=repr(e))
        finally:
            close = getattr(responses, "aclose", None)
            if close is not None:
                await close()
        self.bulk_entries += len(entries)
        return _Chunk(source, first_entry_id, entries, stopped)

    # ------------------------------------------------------------------ per entry

    async def _single_reads(
        self, first_entry_id: int, stretch: int | None
    ) -> AsyncGenerator[list[EntryOutcome], None]:
        """Yields runs of per-entry outcomes from `first_entry_id` on, until a terminal one
        (included) or, with `stretch`, once that many entries are decided."""
        ahead = self._options.recovery_read_ahead
        reads: dict[int, asyncio.Task[EntryOutcome]] = {}
        next_read = first_entry_id
        next_out = first_entry_id
        decided = 0
        try:
            while True:
                # Slow start: one read, then one more in flight per entry decided.
                window = min(ahead, decided + 1)
                if stretch is not None:
                    window = min(window, first_entry_id + stretch - next_out)
                while next_read < next_out + window:
                    reads[next_read] = asyncio.ensure_future(self._read_one(next_read))
                    next_read += 1
                first = await reads.pop(next_out)
                run = [first]
                next_out += 1
                # Take the reads after it that are already answered: one run, one write-back.
                while not run[-1].terminal and next_out in reads and reads[next_out].done():
                    run.append(reads.pop(next_out).result())
                    next_out += 1
                decided += len(run)
                yield run
                if run[-1].terminal or (stretch is not None and decided >= stretch):
                    return
        finally:
            await cancel_all(list(reads.values()))

    async def _read_one(self, entry_id: int) -> EntryOutcome:
        """Returns the outcome of the term-bearing recovery reads of `entry_id` from its write
        set in the captured ensemble. One member is asked first (the first of the write set,
        which rotates with the entry id): its positive alone decides, so the others are asked
        only once it answered anything else or stayed silent for `recovery_read_hedge_s`. A
        present entry costs one request instead of WQ."""
        self.single_reads += 1
        config = self._config
        write_set = self._write_sets[entry_id % config.ensemble]
        tally: RecoveryReadTally[str, pb.Entry] = RecoveryReadTally(
            config, write_set, accept_loss=self._accept_loss
        )
        timeout_s = self._options.recovery_read_timeout_s

        async def ask(bookie_id: str) -> tuple[str, pb.ReadResponse | None]:
            try:
                response = await self._transport.read(
                    bookie_id, self._stream_id, entry_id, term=self._term, timeout_s=timeout_s
                )
            except asyncio.CancelledError:
                raise
            except Exception as e:  # any failure is an unknown answer
                log.debug("recovery.request_failed", bookie=bookie_id, error=repr(e))
                response = None
            return bookie_id, response

        tasks = {asyncio.ensure_future(ask(write_set[0]))}
        later = write_set[1:]  # the members not asked yet
        bookie_term = 0
        try:
            while tally.outcome is ReadOutcome.PENDING:
                done, tasks = await asyncio.wait(
                    tasks,
                    timeout=self._options.recovery_read_hedge_s if later else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in done:
                    bookie_id, response = task.result()
                    code: int | None = None
                    entry = None
                    if response is not None:
                        code = int(response.code)  # the wire enum, as the protocol compares it
                        if code == _OK:
                            entry = response.entry
                            if entry.entry_id != entry_id or not checksum_ok(
                                self._stream_id, entry
                            ):
                                log.warning(
                                    "recovery.bad_entry", bookie=bookie_id, entry_id=entry_id
                                )
                                code, entry = None, None  # proves nothing
                        elif code == Code.INVALID_TERM:
                            bookie_term = max(bookie_term, response.bookie_term)
                    outcome = tally.on_response(bookie_id, code, entry)
                    if tally.invalid_term_seen:
                        newer = max(bookie_term, self._term + 1)
                        return EntryOutcome(entry_id, outcome, None, newer)
                if tally.outcome is ReadOutcome.PENDING and later:
                    # No positive from the first member (yet): ask the whole write set.
                    tasks |= {asyncio.ensure_future(ask(b)) for b in later}
                    later = ()
        finally:
            await cancel_all(list(tasks))
        if tally.outcome is ReadOutcome.RECOVERABLE:
            return EntryOutcome(entry_id, tally.outcome, tally.entry)
        limbo = tally.limbo_members if tally.blocked_by_limbo else ()
        return EntryOutcome(entry_id, tally.outcome, limbo=limbo)
