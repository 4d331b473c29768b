"""The stream writer's asyncio core (docs/design.md §5 "Writing"): appends batched onto the add
pipeline, in-order acknowledgment at AQ, explicit LAC when idle, ensemble changes committed by CAS,
capacity rolls, new-member truncation, and disengaging (or re-engaging) on INVALID_TERM.

Appends may come from any thread (`submit_threadsafe`: a thread-safe deque, the loop woken only
when it is idle) or from the loop itself (`append`). Everything else runs on the loop thread.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import functools
import itertools
import operator
import random
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from stream.client.attributes import HeadersArg, check_headers, check_key
from stream.client.futures import AppendFuture
from stream.client.options import WriterOptions
from stream.client.pipeline import AddPipeline
from stream.client.ports import BookieTransport, MetadataPort, WallClock
from stream.client.producer import ProducerGate, producer_gate
from stream.client.recovery import (
    BookiePlacement,
    Takeover,
    TakeoverResult,
    WriterIdentity,
    _Fenced,
    place_ensemble,
    replace_bookie,
    replacement_choice,
)
from stream.client.timestamps import stamp
from stream.errors import (
    BadVersionError,
    EntryTrimmedError,
    InvalidArgumentError,
    InvalidTermError,
    MetadataError,
    StreamError,
    StreamNotFoundError,
    WriterClosedError,
)
from stream.framing.encoding import Headers
from stream.framing.prepare import (
    AttributedPayload,
    prepare_entries,
    prepare_mixed_entries,
    prepare_sequenced_entries,
)
from stream.metadata.model import (
    Fragment,
    ProducerChange,
    ProducerTerm,
    StreamMeta,
    StreamState,
    validate_producer_id,
)
from stream.protocol import (
    DEFAULT_MAX_ENTRY_BYTES,
    max_entry_bytes,
)
from stream.protocol.invariant import invariant
from stream.protocol.producers import NO_SEQUENCE, ProducerPosition
from stream.protocol.writer_lifecycle import ChangeSlot, Effect, Event, Lifecycle, step

log = structlog.get_logger(__name__)

# Entries moved from the queue into the pipeline per loop turn, so that answers get processed
# between large runs of appends.
_DRAIN_MAX_ENTRIES = 4096
# Appends taken from the queue at a time by a drain (a run prepared and added as a whole).
_DRAIN_RUN_ENTRIES = 256
_second = operator.itemgetter(1)
_INVALID_STATE = (asyncio.InvalidStateError, concurrent.futures.InvalidStateError)

AnyFuture = asyncio.Future[int] | concurrent.futures.Future[int]
# What a job's unexpected exception is reported as: (message prefix, log event).
_JOB_NAMES = {
    Event.CHANGE_ENDED: ("ensemble change", "writer.ensemble_change_failed"),
    Event.ROLL_ENDED: ("fragment roll", "writer.roll_failed"),
}


class _Superseded(Exception):
    """The pipeline (term) a metadata change was planned for was closed or replaced meanwhile:
    the change is dropped. Committing it with the next term's version would graft the old
    term's ensemble onto the new term (a replacement that never received the new term's
    entries, and that the old pipeline then fed its own; found by the BP-46 crash test)."""


class AsyncStreamWriter:
    """Writes one stream in one term (re-engaging in a new term when allowed). Build it, then
    `await open()` (the takeover); `append`/`submit_threadsafe`, `flush`, `close`."""

    def __init__(
        self,
        name: str,
        *,
        transport: BookieTransport,
        metadata: MetadataPort,
        clock: WallClock,
        rng: random.Random,
        options: WriterOptions | None = None,
        identity: WriterIdentity | None = None,
        reengage: bool = False,
        is_leader: Callable[[], bool] | None = None,
        producer_id: str | None = None,
    ) -> None:
        if producer_id is not None:
            validate_producer_id(producer_id)
            if reengage:
                # A new term would restart the producer's position under appends in flight.
                raise InvalidArgumentError(
                    "a producer writer does not re-engage: reopen it", producer_id=producer_id
                )
        self.name = name
        self._transport = transport
        self._metadata = metadata
        self._clock = clock
        self._rng = rng
        self._options = options or WriterOptions()
        self._identity = identity or WriterIdentity(f"writer-{rng.getrandbits(48):012x}")
        self._is_leader = is_leader
        self._producer_id = producer_id
        self._gate: ProducerGate | None = None  # set by the takeover of a producer writer
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        # Appends not yet in the pipeline, from any thread. The window: append number `n`
        # (a ticket) may enter once `n < completed + window_entries`, `completed` counting the
        # appends acknowledged or failed (a Semaphore costs ~5 µs per append; this ~0.2 µs).
        self._queue: deque[tuple[bytes | AttributedPayload, AnyFuture]] = deque()
        # Set (for good) by the first append with attributes: until then every queued payload
        # is plain bytes, prepared by the fastest path without looking at each.
        self._attributes_seen = False
        self._tickets = itertools.count()
        self._completed = 0  # written on the loop thread only
        self._window_entries = self._options.window_entries
        self._room_wanted = False
        self._room_event = threading.Event()
        # Larger payloads are refused before they are sent: a bookie would answer BAD_REQUEST,
        # which counts as its failure, and replacing every member fails the writer.
        self._max_entry_bytes = DEFAULT_MAX_ENTRY_BYTES
        # Appends in the pipeline, not yet acknowledged: their futures in id order, the first
        # one's entry id beside them (ids are contiguous; no per-entry tuple).
        self._unresolved: deque[AnyFuture] = deque()
        self._unresolved_first_id = 0
        self._idle = False
        self._room = asyncio.Event()
        self._room_waiters = 0
        self._acked = asyncio.Event()
        self._error: StreamError | None = None
        # Which jobs run (ensemble change, roll, re-engagement, trim check), closing, stopped:
        # `_step` feeds it events and carries out the effects it returns.
        self._life = Lifecycle(reengage=reengage)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._age_timer: asyncio.TimerHandle | None = None
        # Set by `_install` (the takeover's result).
        self._pipeline: AddPipeline | None = None
        self._meta: StreamMeta | None = None
        self._version = -1
        self._term = 0
        self._fragment: Fragment | None = None
        self._fragment_bytes = 0
        self._fragment_first_ts: int | None = None
        # False when the current fragment held entries of an earlier term whose first
        # timestamp the takeover could not read: the roll then records none (a later guess
        # would claim the fragment starts later than it does, and mislead `seek_time`).
        self._fragment_first_known = True
        self._fragment_last_ts: int | None = None
        # The stream's last entry timestamp: entries are stamped at least this, so that
        # timestamps never go backwards within the stream, across terms and clocks.
        self._last_ts: int | None = None

    # ------------------------------------------------------------------ views

    @property
    def term(self) -> int:
        """Returns the writer's current term."""
        return self._term

    @property
    def stream_id(self) -> int:
        assert self._meta is not None
        return self._meta.id

    @property
    def last_add_confirmed(self) -> int:
        """Returns the LAC: every id up to it is acknowledged."""
        return -1 if self._pipeline is None else self._pipeline.lac

    @property
    def producer_id(self) -> str | None:
        """Returns the writer's producer id (None: not an idempotent producer)."""
        return self._producer_id

    @property
    def last_sequence(self) -> int:
        """Returns the producer's highest sequence: durably written before this writer took
        over (from the producer table and the recovered tail), or appended since; -1 when the
        stream does not know the producer. Raises `InvalidArgumentError` on a writer opened
        without `producer_id`."""
        if self._gate is None:
            raise InvalidArgumentError("not a producer writer (no producer_id)", stream=self.name)
        return self._gate.last_sequence

    @property
    def error(self) -> StreamError | None:
        """Returns the error that stopped the writer, if any."""
        return self._error

    # ------------------------------------------------------------------ open

    async def open(self) -> None:
        """Takes the stream over (new term, recovery) and gets ready to append."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._max_entry_bytes = max_entry_bytes(await self._metadata.available_bookies())
        result = await self._takeover()
        self._install(result)
        self._idle = True

    async def _takeover(self) -> TakeoverResult:
        return await Takeover(
            self.name,
            transport=self._transport,
            metadata=self._metadata,
            clock=self._clock,
            rng=self._rng,
            options=self._options,
            identity=self._identity,
            producer_id=self._producer_id,
        ).run()

    def _install(self, result: TakeoverResult) -> None:
        self._meta, self._version, self._term = result.meta, result.version, result.term
        if self._producer_id is not None:
            self._gate = producer_gate(self._producer_id, result)
        fragment = result.last_fragment
        self._fragment = fragment
        self._pipeline = AddPipeline(
            transport=self._transport,
            owner=self,
            stream_id=result.meta.id,
            term=result.term,
            config=result.meta.quorum,
            fragments=[(fragment.first_entry_id, fragment.ensemble)],
            last_entry_id=result.last_entry_id,
            options=self._options,
            max_in_flight=self._options.window_entries,
        )
        self._fragment_bytes = result.written_bytes
        self._fragment_first_ts = result.first_timestamp_ms
        self._fragment_first_known = (
            result.first_timestamp_ms is not None or result.last_entry_id < fragment.first_entry_id
        )
        self._fragment_last_ts = result.last_timestamp_ms
        if result.last_timestamp_ms is not None:
            self._last_ts = max(self._last_ts or 0, result.last_timestamp_ms)
        # Readers see the recovered entries (up to the no-op) without waiting for an add.
        self._pipeline.schedule_explicit_lac()
        log.info(
            "writer.opened",
            stream=self.name,
            stream_id=result.meta.id,
            term=result.term,
            next_entry_id=result.last_entry_id + 1,
            ensemble=list(fragment.ensemble),
        )

    # ------------------------------------------------------------------ appending

    def submit_threadsafe(
        self,
        payload: bytes,
        key: bytes | None = None,
        headers: HeadersArg | None = None,
        sequence: int | None = None,
    ) -> concurrent.futures.Future[int]:
        """Queues `payload` (with `key`, `headers` and `sequence`, see `append`) from a thread
        other than the loop's, blocking while the window is full; returns a future of its
        entry id, resolved once acknowledged."""
        if threading.get_ident() == self._loop_thread:
            raise InvalidArgumentError("submit_threadsafe called on the writer's loop thread")
        queued: bytes | AttributedPayload = payload
        if type(payload) is not bytes or len(payload) > self._max_entry_bytes:
            queued = payload = self._check_payload(payload)
        if key is not None or headers or sequence is not None or self._gate is not None:
            queued = self._with_attributes(payload, key, headers, sequence)
            if queued.sequence < 0:  # a duplicate: nothing to write
                done: AppendFuture[int] = AppendFuture()
                done.set_result(-queued.sequence - 2)
                return done
        ticket = next(self._tickets)
        if ticket >= self._completed + self._window_entries:
            self._wait_room_threadsafe(ticket)
        if self._error is not None or self._life.closing:
            self._raise_if_stopped()
        future: AppendFuture[int] = AppendFuture()
        self._queue.append((queued, future))
        if self._idle or self._error is not None:
            self._idle = False
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._drain)
        return future

    def _wait_room_threadsafe(self, ticket: int) -> None:
        while ticket >= self._completed + self._window_entries:
            self._raise_if_stopped()
            self._room_wanted = True
            if ticket < self._completed + self._window_entries:
                return
            # A wake-up lost between wait() and clear() costs at most this timeout.
            self._room_event.wait(0.01)
            self._room_event.clear()

    async def append(
        self,
        payload: bytes,
        key: bytes | None = None,
        headers: HeadersArg | None = None,
        sequence: int | None = None,
    ) -> int:
        """Appends `payload` from the loop's thread; returns its entry id once acknowledged.
        `key` (bytes) and `headers` ((name, value) pairs, names str and values bytes, in
        order and possibly repeated; or a mapping of names to values) are stored with the
        entry, covered by its checksum, and returned by readers as `Entry.key` and
        `Entry.headers`. A producer writer's appends each need a `sequence` (docs/design.md
        §11): one at or below `last_sequence` writes nothing and returns the id already
        written (-1 when that is no longer known); a gap or a step back raises
        `InvalidArgumentError`. Other writers refuse `sequence`."""
        return await self.append_nowait(payload, key, headers, sequence)

    def append_nowait(
        self,
        payload: bytes,
        key: bytes | None = None,
        headers: HeadersArg | None = None,
        sequence: int | None = None,
    ) -> Awaitable[int]:
        """Queues `payload` (with `key` and `headers`, see `append`) from the loop's thread
        and returns an awaitable of its entry id; when the window is full the awaitable first
        waits for room."""
        queued: bytes | AttributedPayload = self._check_payload(payload)
        if key is not None or headers or sequence is not None or self._gate is not None:
            queued = self._with_attributes(queued, key, headers, sequence)
            if queued.sequence < 0:  # a duplicate: nothing to write
                assert self._loop is not None
                done: asyncio.Future[int] = self._loop.create_future()
                done.set_result(-queued.sequence - 2)
                return done
        self._raise_if_stopped()
        ticket = next(self._tickets)
        # A producer's appends enter the queue in the order their sequences were admitted.
        if ticket < self._completed + self._window_entries or self._gate is not None:
            return self._enqueue(queued)
        return self._append_when_room(queued, ticket)

    def _with_attributes(
        self,
        payload: bytes,
        key: bytes | None,
        headers: HeadersArg | None,
        sequence: int | None = None,
    ) -> AttributedPayload:
        """Returns `payload` with its checked attributes, and sends every later drain through
        the path that looks for them (set before the payload is queued, so a drain that
        takes it sees the flag). A producer's duplicate comes back with wire sequence
        `-(entry id) - 2` (below zero, never queued); nothing is admitted when a check fails."""
        checked: Headers = ()
        if key is not None or headers:
            key, checked = check_key(key), check_headers(headers)
            size = len(payload) + len(key or b"")
            size += sum(len(name) + len(value) for name, value in checked)
            if size > self._max_entry_bytes:
                raise InvalidArgumentError(
                    "entry with its key and headers larger than the bookies accept "
                    "(their max_entry_bytes)",
                    stream=self.name,
                    size=size,
                    max_entry_bytes=self._max_entry_bytes,
                )
        wire_sequence = self._admit(sequence)
        attributed = AttributedPayload(payload, key, checked, wire_sequence)
        if wire_sequence < 0:
            return attributed
        self._attributes_seen = True
        return attributed

    def _admit(self, sequence: int | None) -> int:
        """Returns the wire sequence of an append numbered `sequence` (0: none; the sequence +
        1 otherwise), or `-(entry id) - 2` for a producer's duplicate; raises
        `InvalidArgumentError` for a refused sequence, or one on a writer that is not a
        producer's."""
        gate = self._gate
        if gate is None:
            if sequence is not None:
                raise InvalidArgumentError(
                    "sequence needs a producer writer (open_writer(..., producer_id=...))",
                    stream=self.name,
                )
            return 0
        duplicate_of = gate.admit(sequence)
        if duplicate_of is not None:
            return -duplicate_of - 2
        assert isinstance(sequence, int)
        return sequence + 1

    async def _append_when_room(self, payload: bytes | AttributedPayload, ticket: int) -> int:
        self._room_waiters += 1
        try:
            while ticket >= self._completed + self._window_entries:
                self._raise_if_stopped()
                self._room.clear()
                await self._room.wait()
        finally:
            self._room_waiters -= 1
        return await self._enqueue(payload)

    def _enqueue(self, payload: bytes | AttributedPayload) -> asyncio.Future[int]:
        assert self._loop is not None
        future: asyncio.Future[int] = self._loop.create_future()
        self._queue.append((payload, future))
        if self._idle:
            self._idle = False
            self._loop.call_soon(self._drain)
        return future

    def _completed_appends(self, count: int) -> None:
        """Counts `count` appends as done (acknowledged or failed): room in the window."""
        self._completed += count
        if self._room_wanted:
            self._room_wanted = False
            self._room_event.set()
        if self._room_waiters:
            self._room.set()

    def _check_payload(self, payload: bytes) -> bytes:
        """Returns `payload` as bytes; raises `InvalidArgumentError` when it is not bytes-like
        or larger than the bookies accept (nothing is queued: the writer stays usable)."""
        if isinstance(payload, bytearray | memoryview):
            payload = bytes(payload)
        elif not isinstance(payload, bytes):
            raise InvalidArgumentError("payload must be bytes", type=type(payload).__name__)
        if len(payload) > self._max_entry_bytes:
            raise InvalidArgumentError(
                "entry larger than the bookies accept (their max_entry_bytes)",
                stream=self.name,
                size=len(payload),
                max_entry_bytes=self._max_entry_bytes,
            )
        return payload

    def _raise_if_stopped(self) -> None:
        error = self._error
        if error is None and self._life.closing:
            error = WriterClosedError("writer is closed", stream=self.name)
        if error is not None:
            raise error

    def _blocked(self) -> bool:
        return self._pipeline is None or self._life.blocked or self._pipeline.closed

    def _drain(self) -> None:
        """Moves queued appends into the pipeline (entry ids, checksums, write sets) and sends
        them; stops at a full pipeline, a full fragment, or a change in progress."""
        self._idle = False
        if self._error is not None:
            self._fail_queue(self._error)
            return
        if self._blocked():
            return  # whoever unblocks calls _drain again
        pipeline = self._pipeline
        assert pipeline is not None and self._meta is not None
        queue = self._queue
        stream_id = self._meta.id
        now_ms = stamp(self._clock, self._last_ts)
        added = 0
        added_bytes = 0
        unresolved = self._unresolved
        popleft = queue.popleft
        while queue and added < _DRAIN_MAX_ENTRIES:
            # Runs of entries: each is checked against the window and the fragment's bounds
            # as a whole (exactly as entry by entry), then prepared and added in C-level loops.
            wanted = min(len(queue), _DRAIN_MAX_ENTRIES - added, _DRAIN_RUN_ENTRIES)
            if pipeline.pending.room() <= 0:
                break
            taken = [popleft() for _ in range(wanted)]
            payloads = [payload for payload, _ in taken]
            prefix_bytes = list(itertools.accumulate(map(len, payloads), initial=0))
            fits = pipeline.room_for(prefix_bytes)
            fragment_fits = self._fragment_room(prefix_bytes, added_bytes)
            count = min(fits, fragment_fits)
            if count < wanted:
                queue.extendleft(reversed(taken[count:]))
                del payloads[count:], taken[count:]
            if count:
                if self._gate is not None:
                    prepare = prepare_sequenced_entries
                elif self._attributes_seen:
                    prepare = prepare_mixed_entries
                else:
                    prepare = prepare_entries
                entries = prepare(stream_id, pipeline.next_entry_id, now_ms, payloads)
                if self._gate is not None:
                    self._gate.assigned(
                        pipeline.next_entry_id,
                        [p.sequence - 1 for p in payloads],  # type: ignore[union-attr]
                    )
                pipeline.add_run(entries)
                if not unresolved:
                    self._unresolved_first_id = entries[0].entry_id
                unresolved.extend(map(_second, taken))
                added += count
                added_bytes += prefix_bytes[count]
            if count < wanted:
                if fragment_fits < fits:
                    self._step(Event.FRAGMENT_FULL)
                break
        if added >= _DRAIN_MAX_ENTRIES and queue:
            assert self._loop is not None
            self._loop.call_soon(self._drain)
        if added:
            if self._fragment_first_ts is None:
                self._fragment_first_ts = now_ms
                self._arm_age_timer()
            self._fragment_last_ts = self._last_ts = now_ms
            self._fragment_bytes += added_bytes
            pipeline.flush()
        if not queue:
            self._idle = True
            if queue:  # an append raced with the flag
                self._idle = False
                assert self._loop is not None
                self._loop.call_soon(self._drain)

    def _fragment_room(self, prefix_bytes: list[int], pending_bytes: int) -> int:
        """Returns how many of the next `len(prefix_bytes) - 1` entries fit in the current
        fragment (`prefix_bytes[i]`: payload bytes of the first `i`; `pending_bytes`: added by
        this drain, not yet counted). A fragment holding entries is full once it reached
        `fragment_max_entries`, `fragment_max_bytes` or `fragment_max_age_s`."""
        assert self._pipeline is not None and self._fragment is not None and self._meta
        count = len(prefix_bytes) - 1
        entries = self._pipeline.next_entry_id - self._fragment.first_entry_id
        meta = self._meta
        if self._fragment_too_old():
            fits = 0
        else:
            bytes_left = meta.fragment_max_bytes - self._fragment_bytes - pending_bytes
            by_bytes = bisect.bisect_left(prefix_bytes, bytes_left, 0, count)
            fits = min(count, max(meta.fragment_max_entries - entries, 0), by_bytes)
        # An empty fragment is never full: its first entry always goes in.
        return max(fits, min(count, 1 - entries))

    def _fragment_too_old(self) -> bool:
        assert self._meta is not None
        max_age_s = self._meta.fragment_max_age_s
        first_ts = self._fragment_first_ts
        if max_age_s is None or first_ts is None:
            return False
        return self._clock.now_ms() - first_ts >= max_age_s * 1000

    def _arm_age_timer(self) -> None:
        assert self._meta is not None and self._loop is not None
        if self._meta.fragment_max_age_s is None:
            return
        if self._age_timer is not None:
            self._age_timer.cancel()
        self._age_timer = self._loop.call_later(self._meta.fragment_max_age_s, self._on_age)

    def _on_age(self) -> None:
        """Rolls an idle fragment whose first entry got too old (retention needs it closed)."""
        self._age_timer = None
        if self._error is not None or self._life.closing or self._blocked():
            return
        assert self._pipeline is not None and self._fragment is not None
        if self._pipeline.next_entry_id > self._fragment.first_entry_id:
            if self._fragment_too_old():
                self._step(Event.FRAGMENT_FULL)
            else:
                self._arm_age_timer()

    # ------------------------------------------------------------------ pipeline events

    def on_acknowledged(self, entry_ids: list[int]) -> None:
        """Resolves the futures of the newly acknowledged entries and frees their window."""
        unresolved = self._unresolved
        first = self._unresolved_first_id
        count = min(entry_ids[-1] + 1 - first, len(unresolved))
        if count > 0:
            popleft = unresolved.popleft
            for entry_id in range(first, first + count):
                try:
                    popleft().set_result(entry_id)
                except _INVALID_STATE:
                    pass  # an awaiting task was cancelled: the entry is still written
            self._unresolved_first_id = first + count
            self._completed_appends(count)
        self._acked.set()
        pipeline = self._pipeline
        assert pipeline is not None
        pipeline.schedule_explicit_lac()

    def on_fully_replicated(self) -> None:
        """Drains more appends: the pipeline's room is bounded by LAFR, not the LAC."""
        if self._queue and not self._idle:
            self._drain()

    def on_bookie_failed(self, bookie_id: str, reason: str) -> None:
        self._step(Event.BOOKIE_FAILED)

    def on_invalid_term(self, bookie_id: str, bookie_term: int) -> None:
        self._on_fenced(bookie_term)

    def on_trimmed(self, bookie_id: str, message: str) -> None:
        if Effect.START_TRIM_CHECK in self._step(Event.TRIMMED):
            self._start_task(self._fail_trimmed(bookie_id, message))

    async def _fail_trimmed(self, bookie_id: str, message: str) -> None:
        """Stops the writer with the reason its entries were trimmed: the stream is gone
        (`StreamNotFoundError`; deleting it trims its bookies) or was trimmed past them
        (`EntryTrimmedError`)."""
        assert self._meta is not None
        stream_id = self._meta.id
        try:
            meta, _, _ = await self._metadata.get_snapshot(stream_id)
        except StreamNotFoundError:
            self._fail(
                StreamNotFoundError(
                    "the stream was deleted while this writer had it open",
                    stream=self.name,
                    stream_id=stream_id,
                    term=self._term,
                )
            )
            return
        except StreamError as e:
            log.warning("writer.trim_check_failed", stream=self.name, error=str(e))
            meta = self._meta
        self._fail(
            EntryTrimmedError(
                "entries being written were trimmed under the writer",
                stream=self.name,
                term=self._term,
                bookie=bookie_id,
                first_entry_id=meta.first_entry_id,
                detail=message,
            )
        )

    def on_error(self, error: Exception) -> None:
        self._fail(StreamError(f"writer failed: {error!r}", stream=self.name))

    def _on_fenced(self, current_term: int) -> None:
        if self._life.stopped or self._life.reengaging:
            return
        error = InvalidTermError(
            "another writer took over the stream",
            term=self._term,
            current_term=current_term,
            stream=self.name,
        )
        log.warning("writer.fenced", stream=self.name, term=self._term, current_term=current_term)
        # Fails the writer, or closes the pipeline and takes the stream over in a new term.
        self._step(Event.FENCED, error)

    async def _reengage_task(self, error: InvalidTermError) -> None:
        try:
            if self._is_leader is not None and not self._is_leader():
                self._fail(error)
                return
            result = await self._takeover()
            if self._error is not None or self._life.closing:
                return
            self._install(result)
            log.info("writer.reengaged", stream=self.name, term=self._term)
        except StreamError as e:
            self._fail(e)
        except Exception as e:
            log.exception("writer.reengage_failed", stream=self.name)
            self._fail(StreamError(f"re-engaging failed: {e!r}", stream=self.name))
        finally:
            self._step(Event.REENGAGE_ENDED)

    def _start_task(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _step(self, event: Event, error: StreamError | None = None) -> tuple[Effect, ...]:
        """Feeds `event` to the lifecycle and carries out the effects it returns (`error`: what
        fails the appends, for the events that fail some); returns the effects, so that a job
        goes on only when granted (`REPLACE_BOOKIE`, `COMMIT_ROLL`, `START_TRIM_CHECK`)."""
        self._life, effects = step(self._life, event)
        for effect in effects:
            if effect is Effect.DRAIN:
                self._drain()
            elif effect is Effect.START_ENSEMBLE_CHANGE:
                self._start_task(self._run_job(self._change_ensemble, Event.CHANGE_ENDED))
            elif effect is Effect.START_ROLL:
                self._start_task(self._run_job(self._roll, Event.ROLL_ENDED))
            elif effect is Effect.CLOSE_PIPELINE:
                assert isinstance(error, InvalidTermError)
                self._close_pipeline(error)
            elif effect is Effect.START_REENGAGE:
                assert isinstance(error, InvalidTermError)
                self._start_task(self._reengage_task(error))
            elif effect is Effect.FAIL_WRITER:
                assert error is not None
                self._stop(error)
        return effects

    async def _run_job(self, job: Callable[[], Awaitable[None]], ended: Event) -> None:
        """Runs the ensemble change or the roll, the one funnel for their exceptions: a newer
        term fences the writer (`_on_fenced`: fails it, or re-engages), a superseded pipeline
        drops the job, any other error stops the writer; `ended` goes to the lifecycle last."""
        try:
            await job()
        except _Superseded:
            pass  # the writer moved on to another term: its own pipeline decides
        except InvalidTermError as e:
            self._on_fenced(e.current_term)  # type: ignore[attr-defined]
        except _Fenced as e:
            self._on_fenced(e.bookie_term)
        except StreamError as e:
            self._fail(e)
        except Exception as e:
            what, log_event = _JOB_NAMES[ended]
            log.exception(log_event, stream=self.name)
            self._fail(StreamError(f"{what} failed: {e!r}", stream=self.name))
        finally:
            self._step(ended)

    # ------------------------------------------------------------------ ensemble change

    async def _change_ensemble(self) -> None:
        """Replaces every failed bookie of the ensemble, one at a time, each change committed
        by CAS before the replacement gets its entries."""
        while self._error is None:
            if Effect.REPLACE_BOOKIE not in self._step(Event.CHANGE_NEXT):
                # A roll is closing its fragment: a change now would alter the ensemble it
                # closes it with (found by the simulator, seed 1106: an acknowledged entry
                # lost).
                await asyncio.sleep(0.01)
                continue
            pipeline = self._pipeline
            if pipeline is None or pipeline.closed:
                return
            failed = self._next_to_replace(pipeline)
            if failed is None:
                return
            await self._replace(pipeline, failed)

    def _next_to_replace(self, pipeline: AddPipeline) -> str | None:
        return replacement_choice(
            pipeline.ensemble, pipeline.failed, pipeline.pending.pinned_bookies(), self._options
        )

    async def _replace(self, pipeline: AddPipeline, failed: str) -> None:
        """Replaces `failed` (`replace_bookie`), commits the change by CAS, then lets the
        replacement have its entries."""
        meta = self._meta
        assert meta is not None
        replaced = await replace_bookie(
            pipeline,
            failed,
            pipeline.failed,
            self._placement(),
            ack_quorum=meta.ack_quorum,
            moot=lambda: self._error is not None or self._superseded(pipeline),
        )
        if replaced is None:
            return
        change, replacement = replaced
        fragment = Fragment(
            change.first_entry_id, pipeline.ensemble, created_ms=self._clock.now_ms()
        )
        await self._commit(
            functools.partial(self._add_fragment, meta.id, fragment, change.replaces_last),
            pipeline,
        )
        self._fragment = fragment
        self._fragment_bytes = pipeline.held_payload_bytes(change.first_entry_id)
        held = pipeline.held.get(change.first_entry_id)
        self._fragment_first_ts = None if held is None else held.timestamp_ms
        self._fragment_first_known = True
        pipeline.unstored_away.discard(failed)  # the metadata holds the change now
        pipeline.unblock(replacement)

    def _placement(self) -> BookiePlacement:
        return BookiePlacement(
            self.name,
            self._transport,
            self._metadata,
            self._rng,
            self._options,
            term=lambda: self._term,
        )

    def _superseded(self, pipeline: AddPipeline) -> bool:
        """Returns whether `pipeline` is no longer the writer's live one (closed or replaced by
        a re-engaged term's)."""
        return pipeline is not self._pipeline or pipeline.closed

    async def _add_fragment(
        self, stream_id: int, fragment: Fragment, replaces: bool, version: int
    ) -> tuple[StreamMeta, int]:
        return await self._metadata.add_fragment(stream_id, version, fragment, replaces)

    async def _commit(
        self, change: Callable[[int], Awaitable[tuple[StreamMeta, int]]], pipeline: AddPipeline
    ) -> None:
        """Runs one metadata CAS for `pipeline`'s term with the writer's version; after losing
        to a same-term change (retention), rereads and retries; a newer term raises
        `InvalidTermError`, and `_Superseded` when the writer moved on to another pipeline
        (a re-engaged term) meanwhile."""
        assert self._meta is not None
        term = self._term
        for _ in range(self._options.cas_attempts):
            if self._superseded(pipeline) or self._term != term:
                raise _Superseded()
            try:
                self._meta, self._version = await change(self._version)
                return
            except BadVersionError:
                meta, version, _ = await self._metadata.get_snapshot(self._meta.id)
                if self._superseded(pipeline) or self._term != term:
                    raise _Superseded() from None
                if meta.term != term or meta.state is not StreamState.OPEN:
                    raise InvalidTermError(
                        "another writer took over the stream",
                        term=term,
                        current_term=meta.term,
                        stream=self.name,
                    ) from None
                self._meta, self._version = meta, version
        raise MetadataError("metadata change kept losing the CAS", stream=self.name)

    # ------------------------------------------------------------------ capacity roll

    async def _roll(self) -> None:
        """Closes the full fragment in metadata and continues on a freshly placed ensemble,
        once every entry of the fragment reached its whole write set."""
        pipeline = self._pipeline
        meta = self._meta
        assert pipeline is not None and meta is not None
        last = pipeline.next_entry_id - 1
        while (pipeline.lafr < last or self._life.change is not ChangeSlot.NONE) and (
            self._error is None
        ):
            if pipeline is not self._pipeline:
                return
            await pipeline.wait_progress(0.05)
        if self._error is not None or pipeline is not self._pipeline or pipeline.closed:
            return
        fragment = self._fragment
        assert fragment is not None
        if fragment.first_entry_id > last:
            # An ensemble change while we waited started its fragment at LAFR + 1, our
            # boundary: the full fragment is closed already, nothing is left to roll.
            return
        invariant(
            Effect.COMMIT_ROLL in self._step(Event.ROLL_READY),
            "a roll commits only while no ensemble change runs",
            stream=self.name,
        )
        ensemble = await place_ensemble(
            self._placement(),
            meta,
            last,
            exclude=pipeline.failed,
            members=pipeline.ensemble,
        )
        now_ms = self._clock.now_ms()
        closed = Fragment(
            fragment.first_entry_id,
            tuple(pipeline.ensemble),
            created_ms=fragment.created_ms,
            last_entry_id=last,
            bytes=self._fragment_bytes,
            first_timestamp_ms=self._fragment_first_ts if self._fragment_first_known else None,
            last_timestamp_ms=self._fragment_last_ts,
        )
        new = Fragment(last + 1, ensemble, created_ms=now_ms)
        producers = self._roll_producers(last, now_ms)
        await self._commit(
            lambda version: self._metadata.roll_fragment(meta.id, version, closed, new, producers),
            pipeline,
        )
        if self._gate is not None:
            self._gate.forget_before(last + 1)
        pipeline.roll(last + 1, ensemble)
        self._fragment = new
        self._fragment_bytes = 0
        self._fragment_first_ts = None
        self._fragment_first_known = True
        self._fragment_last_ts = None
        log.info(
            "writer.rolled",
            stream=self.name,
            term=self._term,
            closed_last_entry_id=last,
            ensemble=list(ensemble),
        )

    def _roll_producers(self, last: int, now_ms: int) -> ProducerChange | None:
        """Returns what a roll closing at `last` records of this writer's producer: its last
        sequence up to there, and its term moved to the new fragment (None: not a producer)."""
        gate = self._gate
        if gate is None:
            return None
        sequence = gate.sequence_at(last)
        positions = ()
        if sequence != NO_SEQUENCE:
            positions = (ProducerPosition(gate.producer_id, sequence, last, now_ms),)
        return ProducerChange(
            positions,
            now_ms,
            int(self._options.producer_expiry_s * 1000),
            ProducerTerm(self._term, gate.producer_id, last + 1),
        )

    # ------------------------------------------------------------------ stopping

    def _close_pipeline(self, error: StreamError) -> None:
        """Closes the pipeline and fails the appends in it with `error`."""
        if self._pipeline is not None:
            self._pipeline.close()
        unresolved = self._unresolved
        count = len(unresolved)
        while unresolved:
            future = unresolved.popleft()
            try:
                future.set_exception(error)
            except _INVALID_STATE:
                pass
        self._completed_appends(count)
        self._acked.set()

    def _fail_queue(self, error: StreamError) -> None:
        queue = self._queue
        count = 0
        while queue:
            _, future = queue.popleft()
            try:
                future.set_exception(error)
            except _INVALID_STATE:
                pass
            count += 1
        self._completed_appends(count)

    def _fail(self, error: StreamError) -> None:
        """Stops the writer for good (unless stopped already): every pending and later append
        fails with `error`."""
        closed = isinstance(error, WriterClosedError)
        self._step(Event.STOPPED if closed else Event.FAILED, error)

    def _stop(self, error: StreamError) -> None:
        self._error = error
        if not isinstance(error, WriterClosedError):
            log.warning("writer.stopped", stream=self.name, term=self._term, error=str(error))
        self._close_pipeline(error)
        self._fail_queue(error)
        if self._age_timer is not None:
            self._age_timer.cancel()
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()

    async def flush(self) -> None:
        """Returns once every append queued so far is acknowledged; raises the writer's error
        when it stopped."""
        while self._queue or self._unresolved:
            if self._error is not None:
                raise self._error
            self._acked.clear()
            await self._acked.wait()
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        """Stops the writer at once, without flushing: pending and later appends fail with
        `WriterClosedError`. Appends not yet acknowledged may or may not be kept: the next
        writer's takeover decides. `close()` still releases the writer's resources."""
        self._fail(WriterClosedError("writer aborted", stream=self.name))

    async def close(self) -> None:
        """Flushes, publishes the final LAC to the ensemble, closes the streams and
        unregisters the writer. The stream stays OPEN in this term: the next writer takes
        over with a new term."""
        if self._life.closing:
            return
        try:
            if self._error is None:
                await self.flush()
        finally:
            self._step(Event.CLOSE_REQUESTED)
        pipeline = self._pipeline
        if pipeline is not None and self._error is None and not pipeline.closed:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self._options.add_timeout_s
            if pipeline.lac_behind():
                pipeline.schedule_explicit_lac()
            while (
                (pipeline.lac_behind() or pipeline.inflight_batches())
                and loop.time() < deadline
                and self._error is None
            ):
                if pipeline.lac_behind():
                    pipeline.schedule_explicit_lac()
                await asyncio.sleep(self._options.explicit_lac_delay_s)
        self._fail(WriterClosedError("writer is closed", stream=self.name))
        if self._meta is not None:
            try:
                await self._metadata.unregister_writer(self._meta.id)
            except StreamError as e:
                log.warning("writer.unregister_failed", stream=self.name, error=str(e))
        log.info("writer.closed", stream=self.name, term=self._term)
