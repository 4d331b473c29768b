"""The stream reader's asyncio core (docs/design.md §5 "Reading"): reads at or below the LAC, one
bookie of the write set at a time with speculative reads after a timeout, ReadRange catch-up on
unstriped ensembles, checksum verification, no-op entries skipped, trimmed entries refused, and
`tail`, which long-polls `ReadLac` and follows fragment changes through the metadata watch.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

from stream.client.answer_buffers import AnswerBuffers
from stream.client.answers import answer_or_none, answers_or_none
from stream.client.entry import Entry, EntryColumns, verified_columns
from stream.client.options import ReaderOptions
from stream.client.ports import BookieTransport, MetadataPort
from stream.client.range_answer import range_answer
from stream.client.timeseek import first_at_or_after, search_range
from stream.errors import (
    BookieError,
    ChecksumError,
    EntryNotWrittenError,
    EntryTrimmedError,
    InvalidArgumentError,
    MetadataUnavailableError,
    StreamNotFoundError,
)
from stream.logs import get_logger
from stream.metadata.model import Fragment, StreamMeta, StreamState
from stream.protocol import Code, fragment_index_for

log = get_logger(__name__)

_OK = int(Code.OK)
_TRIMMED = int(Code.TRIMMED)


class _ReadFailed(Exception):
    """No bookie of the write set returned the entry."""

    def __init__(self, entry_id: int, codes: list[str], trimmed: bool, bad_checksum: bool):
        super().__init__(entry_id)
        self.entry_id = entry_id
        self.codes = codes
        self.trimmed = trimmed
        self.bad_checksum = bad_checksum


class AsyncStreamReader:
    """Reads one stream. `await open()`, then `read(first, last)` or `tail(start)`, both
    async iterators of entry lists (no-ops left out), or `read_columns(first, last)`, the
    same entries as `EntryColumns`."""

    def __init__(
        self,
        name: str,
        *,
        transport: BookieTransport,
        metadata: MetadataPort,
        rng: random.Random,
        options: ReaderOptions | None = None,
        columns: AnswerBuffers | None = None,
    ) -> None:
        """`columns`: where the payload columns of large answers are built, reused once the
        caller let go of them (a client's readers, on its loop, share the client's); by
        default the reader's own."""
        self.name = name
        self._transport = transport
        self._metadata = metadata
        self._rng = rng
        self._options = options or ReaderOptions()
        self._columns = AnswerBuffers() if columns is None else columns
        self._meta: StreamMeta | None = None
        self._version = -1
        self._fragments: list[Fragment] = []
        self._firsts: list[tuple[int, tuple[str, ...]]] = []
        # The metadata read in flight (one at a time: a read ZooKeeper does not answer holds a
        # thread until its retry deadline), and whether the last one failed to answer in time.
        self._refreshing: asyncio.Future[None] | None = None
        self._stale = False
        # Single-entry reads the last `seek_time` made.
        self.last_seek_reads = 0
        # An LAC read before this reader's first snapshot (`open`'s `known_lac`), if any.
        self._known_lac: int | None = None

    @property
    def meta(self) -> StreamMeta:
        assert self._meta is not None
        return self._meta

    @property
    def fragments(self) -> list[Fragment]:
        return self._fragments

    async def open(self, stream_id: int | None = None, known_lac: int | None = None) -> None:
        """Reads the stream's metadata; raises `StreamNotFoundError`. With `stream_id` (the
        id the caller found the stream under), reads that stream's snapshot without looking
        its name up: `StreamNotFoundError` also when that stream was deleted, though its name
        may now lead to another one. `known_lac` (with `stream_id`): an LAC of that stream
        the caller read before this call; reads that end at or below it neither reread the
        metadata nor ask the bookies for the LAC. The snapshot read here, after that LAC,
        locates those entries: they were committed before it, and no later fragment change
        moves a committed entry (a writer's new fragment starts past its LAC, a recovery's
        past every committed entry), so a stale snapshot can only miss a trim or a replaced
        bookie, which a failed read rereads the metadata for. An LAC given to a read of a
        reader opened earlier would not do: that reader's last fragment may have been closed
        meanwhile before entries the LAC covers, whose ids a bookie of it may hold with
        other, never committed data."""
        if known_lac is not None:
            if stream_id is None:
                raise InvalidArgumentError(
                    "known_lac needs the stream_id it was read under (the name may now lead to "
                    "another stream)",
                    stream=self.name,
                )
            if type(known_lac) is not int or known_lac < -1:
                raise InvalidArgumentError(
                    "known_lac must be an entry id or -1", stream=self.name, known_lac=known_lac
                )
        if stream_id is None:
            meta, _ = await self._metadata.get_stream(self.name)
            stream_id = meta.id
        await self._snapshot(stream_id)
        self._known_lac = known_lac

    async def refresh(self) -> None:
        """Rereads the stream's meta and fragments (one consistent snapshot)."""
        assert self._meta is not None
        await self._snapshot(self._meta.id)

    async def _snapshot(self, stream_id: int) -> None:
        try:
            meta, version, fragments = await self._metadata.get_snapshot(stream_id)
        except StreamNotFoundError:
            raise StreamNotFoundError(
                "stream not found", stream=self.name, stream_id=stream_id
            ) from None
        if meta.name != self.name:  # not this name's stream: as if it were gone
            raise StreamNotFoundError(
                "stream not found", stream=self.name, stream_id=stream_id, named=meta.name
            )
        self._meta, self._version, self._fragments = meta, version, fragments
        self._firsts = [(f.first_entry_id, tuple(f.ensemble)) for f in fragments]

    async def _refresh_or_keep(self) -> None:
        """Rereads the metadata, or keeps the snapshot it has when the metadata does not answer
        within `metadata_wait_s` (ZooKeeper out of reach): the fragments known so far still
        locate the committed entries (an entry at or below the LAC never changes or moves
        without a metadata write that a reader may see late anyway). The read goes on in the
        background and its snapshot is taken when it comes (`_stale` until then)."""
        if self._meta is None:
            await self.refresh()
            return
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self.refresh())
            # Its failure is seen here or by the next caller; never an unretrieved exception.
            self._refreshing.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            await asyncio.wait_for(asyncio.shield(self._refreshing), self._options.metadata_wait_s)
        except (TimeoutError, MetadataUnavailableError) as e:
            if not self._stale:
                log.warning("reader.metadata_unreachable", stream=self.name, error=repr(e))
            self._stale = True
            return
        if self._stale:
            log.info("reader.metadata_reachable", stream=self.name)
        self._stale = False

    async def _refresh_if_changed(self) -> None:
        """Rereads the fragments only when the meta moved (every change to the fragments
        rewrites the meta): one read instead of one per fragment."""
        meta, version = await self._metadata.get_stream(self.name)
        if self._meta is None or meta.id != self._meta.id or version != self._version:
            await self.refresh()
        else:
            self._meta = meta

    def committed_floor(self) -> int:
        """Returns an LAC bound that metadata alone proves: every entry before the last
        fragment is committed (a fragment only ever starts after fully replicated entries),
        and so is a closed fragment's last entry."""
        floor = -1
        if len(self._fragments) > 1:
            floor = self._fragments[-1].first_entry_id - 1
        for fragment in self._fragments[-2:]:
            if fragment.last_entry_id is not None:
                floor = max(floor, fragment.last_entry_id)
        # A SEALED stream's end is committed too: its bookies may have lost the LAC the seal
        # published to them (it is not durable), and no writer will ever send another.
        sealed_end = self._sealed_end()
        if sealed_end is not None:
            floor = max(floor, sealed_end)
        return floor

    async def lac(self) -> int:
        """Returns the stream's LAC as far as the last fragment's bookies (asked at once, no
        long poll) and the metadata tell."""
        floor = self.committed_floor()
        if not self._fragments:
            return floor
        ensemble = self._fragments[-1].ensemble
        answers = await answers_or_none(
            self._transport.read_lac(
                b,
                self.meta.id,
                -1,
                wait_ms=0,
                timeout_s=self._options.speculative_timeout_s * 5,
                data_port=self._options.data_port,
            )
            for b in ensemble
        )
        found = [a.lac for a in answers if a is not None and a.code == _OK]
        return max([floor, *found])

    # ------------------------------------------------------------------ bounded reads

    async def read(self, first: int, last: int) -> AsyncIterator[list[Entry]]:
        """Yields the entries `first..last` in order, in lists, no-ops left out. Raises
        `EntryTrimmedError` below the first retained entry and `EntryNotWrittenError` when
        `last` is above the LAC. Rereads the metadata and the LAC first, unless `last` is
        within the LAC the reader was opened with (`open`)."""
        name = self.name
        async for columns in self.read_columns(first, last):
            yield columns.to_entries(name)

    async def read_columns(self, first: int, last: int) -> AsyncIterator[EntryColumns]:
        """As `read`, but yields the entries as columns (never empty), as the bookies returned
        them (up to a ReadRange answer each): no `Entry` object per entry."""
        if type(first) is not int or type(last) is not int or not 0 <= first <= last:
            raise InvalidArgumentError(
                "read needs 0 <= first <= last", stream=self.name, first=first, last=last
            )
        known_lac = self._known_lac
        unknown = known_lac is None or last > known_lac or self._meta is None
        if unknown:
            await self._refresh_or_keep()
        self._check_trimmed(first)
        if unknown and last > (lac := await self.lac()):
            raise EntryNotWrittenError(
                "entry not written yet", stream=self.name, entry_id=last, lac=lac
            )
        async for _, columns in self._read_committed(first, last):
            if len(columns):  # not `.ids`: that would unpack the buffers
                yield columns

    def _check_trimmed(self, entry_id: int) -> None:
        first_retained = self.meta.first_entry_id
        if entry_id < first_retained:
            raise EntryTrimmedError(
                "entry was trimmed",
                stream=self.name,
                entry_id=entry_id,
                first_entry_id=first_retained,
            )

    async def _read_committed(
        self, first: int, last: int
    ) -> AsyncIterator[tuple[int, EntryColumns]]:
        """Yields `(highest id covered, columns)` for `first..last`, all at or below the LAC,
        in order, fragment by fragment (the columns may be empty: all no-ops)."""
        position = first
        refreshed = False
        while position <= last:
            index = fragment_index_for(self._firsts, position)
            ensemble = self._firsts[index][1]
            end = last
            if index + 1 < len(self._firsts):
                end = min(last, self._firsts[index + 1][0] - 1)
            try:
                if self.meta.ensemble == self.meta.write_quorum:
                    segments = self._read_ranges(position, end, ensemble)
                else:
                    segments = self._read_striped(position, end, ensemble)
                async for covered, columns in segments:
                    position = covered + 1
                    refreshed = False
                    yield covered, columns
            except _ReadFailed as failure:
                # The fragment may have changed (or been trimmed) since our snapshot.
                await self._refresh_or_keep()
                self._check_trimmed(failure.entry_id)
                if self._stale:
                    raise self._unlocatable(failure) from None
                if refreshed:
                    raise self._read_error(failure) from None
                refreshed = True

    def _unlocatable(self, failure: _ReadFailed) -> EntryTrimmedError | MetadataUnavailableError:
        """The error of an entry its known bookies did not return while the metadata, which
        would say where it went (a fragment re-replicated, trimmed), is out of reach."""
        if failure.trimmed:
            return EntryTrimmedError(
                "entry was trimmed (metadata out of reach: first_entry_id is only a lower bound)",
                stream=self.name,
                entry_id=failure.entry_id,
                first_entry_id=failure.entry_id + 1,
            )
        return MetadataUnavailableError(
            "entry not returned by the bookies the reader knows, and the metadata that would "
            "say where it is cannot be read",
            stream=self.name,
            entry_id=failure.entry_id,
            codes=",".join(failure.codes),
        )

    def _read_error(self, failure: _ReadFailed) -> ChecksumError | BookieError:
        """Returns the error of an entry that no bookie of its write set returned."""
        if failure.bad_checksum:
            return ChecksumError(
                "every copy read failed its checksum",
                stream=self.name,
                entry_id=failure.entry_id,
            )
        return BookieError(
            "no bookie returned the entry",
            stream=self.name,
            entry_id=failure.entry_id,
            codes=",".join(failure.codes),
        )

    async def _read_ranges(
        self, first: int, last: int, ensemble: Sequence[str]
    ) -> AsyncIterator[tuple[int, EntryColumns]]:
        """Catch-up on an unstriped ensemble: ReadRange from one bookie; where it stops or
        fails, a speculative single read and the next bookie."""
        stream_id = self.meta.id
        order = list(ensemble)
        self._rng.shuffle(order)
        attempt = 0
        position = first
        options = self._options
        while position <= last:
            bookie_id = order[attempt % len(order)]
            # Until the first entries came, a request asks for `range_first_entries`: the
            # caller gets them after that many are read, not after a whole answer of
            # `range_batch_bytes` (8 MiB for Spark: 19 ms against 3, docs/benchmarks.md); the
            # next request, in full answers, goes out while the caller takes them.
            count = options.range_max_entries
            if position == first:
                count = min(count, options.range_first_entries)
            upto = min(last, position + count - 1)
            progressed = False
            try:
                async for answer in self._transport.read_range_raw(
                    bookie_id,
                    stream_id,
                    position,
                    upto,
                    max_batch_bytes=options.range_batch_bytes,
                    timeout_s=options.read_timeout_s,
                    data_port=options.data_port,
                ):
                    # Serialized answers are walked by the compiled walker (range_answer).
                    got = range_answer(stream_id, position, answer, self._columns)
                    if got.accepted:
                        position += got.accepted
                        progressed = True
                        yield position - 1, got.columns
                    if got.accepted != got.entries or got.code != _OK:
                        break
            except Exception as e:  # an unknown answer: try elsewhere
                log.debug("reader.range_failed", bookie=bookie_id, error=repr(e))
            if position <= last and not progressed:
                columns = await self._read_one(position, ensemble)
                position += 1
                yield position - 1, columns
                attempt += 1

    async def _read_striped(
        self, first: int, last: int, ensemble: Sequence[str]
    ) -> AsyncIterator[tuple[int, EntryColumns]]:
        """Striped ensembles: runs of WQ consecutive entries (bookie `(s + WQ - 1) % E` holds
        all of `s..s+WQ-1`), each read with one ReadRange, issued ahead in parallel and
        yielded in order; entries a run did not return are read one by one."""
        run = self.meta.write_quorum
        window = max(1, self._options.read_ahead // run)
        # Keyed by each run's first id; a run covers `first..min(last, first + run - 1)`.
        tasks: dict[int, asyncio.Task[EntryColumns]] = {}
        next_issue = first
        position = first
        try:
            while position <= last:
                while next_issue <= last and len(tasks) < window:
                    end = min(last, next_issue + run - 1)
                    tasks[next_issue] = asyncio.ensure_future(
                        self._read_run(next_issue, end, ensemble)
                    )
                    next_issue = end + 1
                start = position
                batch = await tasks.pop(position)
                position = min(last, position + run - 1) + 1
                # Take what is already there without waiting.
                while position in tasks and tasks[position].done() and position - start < 1024:
                    batch.extend(tasks.pop(position).result())
                    position = min(last, position + run - 1) + 1
                yield position - 1, batch
        finally:
            for task in tasks.values():
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks.values(), return_exceptions=True)

    async def _read_run(self, first: int, last: int, ensemble: Sequence[str]) -> EntryColumns:
        """Returns the entries `first..last` (at most WQ of them) of a striped ensemble."""
        meta = self.meta
        holder = ensemble[(first + meta.write_quorum - 1) % meta.ensemble]
        got = EntryColumns.empty()
        position = first
        try:
            async for response in self._transport.read_range(
                holder,
                meta.id,
                first,
                last,
                max_batch_bytes=self._options.range_batch_bytes,
                timeout_s=self._options.speculative_timeout_s * 5,
                data_port=self._options.data_port,
            ):
                entries = response.entries
                count = verified_columns(meta.id, position, entries, *got)
                position += count
                if count != len(entries) or response.code != _OK:
                    break
        except Exception as e:  # an unknown answer: read the rest one by one
            log.debug("reader.run_failed", bookie=holder, error=repr(e))
        for entry_id in range(position, last + 1):
            got.extend(await self._read_one(entry_id, ensemble))
        return got

    async def _read_one(self, entry_id: int, ensemble: Sequence[str]) -> EntryColumns:
        """Returns `entry_id` (no columns if a no-op) from a bookie of its write set: one at a
        time, the next one when the previous failed or after `speculative_timeout_s` (both
        then race)."""
        meta = self.meta
        write_set = list(meta.quorum.write_set_bookies(ensemble, entry_id))
        shift = self._rng.randrange(len(write_set))
        write_set = write_set[shift:] + write_set[:shift]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.read_timeout_s
        pending: set[asyncio.Task[tuple[str, Any]]] = set()
        codes: list[str] = []
        trimmed = bad_checksum = False
        launched = 0

        async def ask(bookie_id: str) -> tuple[str, Any]:
            return bookie_id, await answer_or_none(
                self._transport.read(
                    bookie_id, meta.id, entry_id, timeout_s=self._options.read_timeout_s
                )
            )

        try:
            while True:
                if launched < len(write_set):
                    pending.add(asyncio.ensure_future(ask(write_set[launched])))
                    launched += 1
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise _ReadFailed(entry_id, [*codes, "TIMEOUT"], trimmed, bad_checksum)
                wait_s = remaining
                if launched < len(write_set):
                    wait_s = min(remaining, self._options.speculative_timeout_s)
                done, pending = await asyncio.wait(
                    pending, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    bookie_id, response = task.result()
                    if response is None:
                        codes.append(f"{bookie_id}:ERROR")
                        continue
                    if response.code == _OK:
                        got = EntryColumns.empty()
                        if verified_columns(meta.id, entry_id, (response.entry,), *got):
                            return got
                        bad_checksum = True
                        log.warning("reader.bad_checksum", bookie=bookie_id, entry_id=entry_id)
                        codes.append(f"{bookie_id}:CHECKSUM")
                        continue
                    trimmed = trimmed or response.code == _TRIMMED
                    codes.append(f"{bookie_id}:{Code(response.code).name}")
                if not pending and launched >= len(write_set):
                    raise _ReadFailed(entry_id, codes, trimmed, bad_checksum)
        finally:
            for task in pending:
                task.cancel()

    # ------------------------------------------------------------------ reading by time

    async def seek_time(self, ts_ms: int) -> int:
        """Returns the id of the first entry stamped at or after `ts_ms` (milliseconds since
        the Unix epoch): the first retained entry when every retained entry is that late, the
        id after the LAC (where the next entry goes) when every entry is earlier. No-ops are
        never the answer. About log2 of a fragment's entries single-entry reads: the fragment
        comes from the recorded timestamps, the entry from a binary search in it; how many
        reads it took is `last_seek_reads`."""
        if type(ts_ms) is not int or ts_ms < 0:
            raise InvalidArgumentError(
                "ts_ms must be an int >= 0 (milliseconds since the Unix epoch)",
                stream=self.name,
                ts_ms=ts_ms,
            )
        while True:
            try:
                return await self._seek_once(ts_ms)
            except _ReadFailed as failure:
                await self.refresh()
                if failure.entry_id < self.meta.first_entry_id:
                    continue  # retention trimmed it meanwhile: search what is left
                raise self._read_error(failure) from None

    async def _seek_once(self, ts_ms: int) -> int:
        """One `seek_time` on a fresh snapshot of the metadata; raises `_ReadFailed`."""
        await self._refresh_if_changed()
        first_retained = self.meta.first_entry_id
        end = max(await self.lac() + 1, first_retained)
        lo, hi = search_range(self._fragments, first_retained, end, ts_ms)
        self.last_seek_reads = 0

        async def probe(entry_id: int) -> tuple[int, int] | None:
            for position in range(entry_id, end):
                self.last_seek_reads += 1
                ensemble = self._firsts[fragment_index_for(self._firsts, position)][1]
                columns = await self._read_one(position, ensemble)
                if columns.ids:
                    return position, columns.timestamps_ms[0]
            return None

        found = await first_at_or_after(lo, hi, end, ts_ms, probe)
        log.debug(
            "reader.seek_time",
            stream=self.name,
            ts_ms=ts_ms,
            entry_id=found,
            reads=self.last_seek_reads,
            searched_from=lo,
            searched_to=hi,
            end=end,
        )
        return found

    # ------------------------------------------------------------------ tailing

    async def tail(
        self,
        start: str | int = "earliest",
        idle_timeout_s: float | None = None,
        on_trimmed: str = "raise",
        *,
        start_time_ms: int | None = None,
    ) -> AsyncIterator[list[Entry]]:
        """Yields entry lists as the LAC moves, from `start` ("earliest": the first retained
        entry, "latest": the first after the current LAC, or an entry id), until no entry
        arrived for `idle_timeout_s` (None: forever) or, on a SEALED stream, after its last
        entry. When retention trims past the tail's
        position, `on_trimmed="raise"` raises `EntryTrimmedError` (its `first_entry_id` is
        the first retained entry) and `"skip"` continues from the first retained entry.

        `start_time_ms` (instead of `start`) starts at the first entry stamped at or after
        that time (`seek_time`); entries stamped earlier are never yielded (a time after
        every entry waits for entries that late)."""
        if idle_timeout_s is not None and not idle_timeout_s >= 0:
            raise InvalidArgumentError("timeout must be >= 0", timeout_s=idle_timeout_s)
        if on_trimmed not in ("raise", "skip"):
            raise InvalidArgumentError("on_trimmed must be 'raise' or 'skip'", value=on_trimmed)
        not_before = start_time_ms
        if start_time_ms is not None:
            if start != "earliest":
                raise InvalidArgumentError(
                    "pass either start or start_time_ms", start=start, start_time_ms=start_time_ms
                )
            start = await self.seek_time(start_time_ms)
        await self._refresh_or_keep()
        changed = asyncio.Event()

        def on_change(version: int | None) -> None:
            changed.set()

        stop_watch = self._metadata.watch_meta(self.meta.id, on_change)
        loop = asyncio.get_running_loop()
        try:
            known_lac = await self.lac()
            if start == "earliest":
                position = self.meta.first_entry_id
            elif start == "latest":
                position = known_lac + 1
            elif type(start) is int and start >= 0:
                position = start
                if on_trimmed == "skip":
                    position = max(position, self.meta.first_entry_id)
                self._check_trimmed(position)
            else:
                raise InvalidArgumentError(
                    "start must be 'earliest', 'latest' or an entry id >= 0", start=start
                )
            idle_deadline = None if idle_timeout_s is None else loop.time() + idle_timeout_s
            while True:
                if position <= known_lac:
                    try:
                        if changed.is_set():
                            # Retention may have moved the first retained entry past us.
                            changed.clear()
                            await self._refresh_or_keep()
                        self._check_trimmed(position)
                        upto = min(known_lac, position + self._options.range_max_entries - 1)
                        async for covered, columns in self._read_committed(position, upto):
                            position = covered + 1
                            if len(columns):
                                if idle_timeout_s is not None:
                                    idle_deadline = loop.time() + idle_timeout_s
                                entries = columns.to_entries(self.name)
                                if not_before is not None:
                                    entries = [e for e in entries if e.timestamp_ms >= not_before]
                                    if not entries:
                                        continue
                                    not_before = None  # timestamps never go backwards
                                yield entries
                    except MetadataUnavailableError:
                        # An entry it cannot locate yet: wait for the metadata, not give up.
                        await asyncio.sleep(self._options.retry_backoff_s)
                        if idle_deadline is not None and loop.time() > idle_deadline:
                            return
                    except EntryTrimmedError as trimmed:
                        if on_trimmed != "skip":
                            raise
                        first_retained = max(self.meta.first_entry_id, position + 1)
                        log.info(
                            "reader.skipped_trimmed",
                            stream=self.name,
                            from_entry_id=position,
                            to_entry_id=first_retained,
                            reason=str(trimmed),
                        )
                        position = first_retained
                    continue
                sealed_end = self._sealed_end()
                if sealed_end is not None and position > sealed_end:
                    return  # nothing can follow the end of a sealed stream
                wait_ms = self._options.lac_poll_ms
                if idle_deadline is not None:
                    remaining_s = idle_deadline - loop.time()
                    if remaining_s <= 0:
                        return
                    wait_ms = max(1, min(wait_ms, int(remaining_s * 1000)))
                known_lac = max(known_lac, await self._wait_lac(known_lac, wait_ms, changed))
        finally:
            stop_watch()

    def _sealed_end(self) -> int | None:
        """Returns the last entry id of a SEALED stream, None while it may still grow. The
        sealing takeover wrote nothing after the truncate no-op its term starts with; the
        stream's first takeover recovers nothing and writes no no-op (its term starts at the
        first entry it would have written)."""
        meta = self.meta
        if meta.state is not StreamState.SEALED or not meta.term_history:
            return None
        term, first_entry_id = meta.term_history[-1]
        if term != meta.term:
            return None
        return first_entry_id - 1 if len(meta.term_history) == 1 else first_entry_id

    async def _wait_lac(self, known_lac: int, wait_ms: int, changed: asyncio.Event) -> int:
        """Returns the LAC once a bookie of the last fragment reports one above `known_lac`,
        the metadata changed, or `wait_ms` passed (then `known_lac` or the metadata floor).
        While the metadata is out of reach, it tries again each time and polls the known
        fragment's bookies meanwhile."""
        if changed.is_set() or self._stale:
            changed.clear()
            await self._refresh_or_keep()
            if not self._stale:
                return self.committed_floor()
        ensemble = self._fragments[-1].ensemble if self._fragments else ()
        loop = asyncio.get_running_loop()
        started = loop.time()
        polls = {
            asyncio.ensure_future(
                self._transport.read_lac(
                    b,
                    self.meta.id,
                    known_lac,
                    wait_ms=wait_ms,
                    timeout_s=wait_ms / 1000 + 5,
                    data_port=self._options.data_port,
                )
            )
            for b in ensemble
        }
        watch = asyncio.ensure_future(changed.wait())
        best = known_lac
        try:
            waiting: set[asyncio.Future[Any]] = {*polls, watch}
            while polls and best <= known_lac:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if watch in done:
                    changed.clear()
                    await self._refresh_or_keep()
                    best = max(best, self.committed_floor())
                    break
                for task in done:
                    polls.discard(task)
                    if task.cancelled() or task.exception() is not None:
                        continue
                    response = task.result()
                    if response.code == _OK:
                        best = max(best, response.lac)
        finally:
            for task in (*polls, watch):
                task.cancel()
            await asyncio.gather(*polls, watch, return_exceptions=True)
        if best <= known_lac and loop.time() - started < wait_ms / 1000 / 2:
            # Every bookie failed at once (down, or the stream unknown to them): back off.
            await asyncio.sleep(self._options.retry_backoff_s)
        return best
