"""The stream writer's asyncio core (docs/design.md §5 "Writing"): appends batched onto the add
pipeline, in-order acknowledgment at AQ, explicit LAC when idle, and the effects of the fragment
lifecycle (`stream.protocol.writer_lifecycle`): ensemble changes (`ensemble_change_job`),
capacity rolls (`roll_job`), and disengaging (or re-engaging) on INVALID_TERM.

Appends may come from any thread (`submit_threadsafe`: a thread-safe deque, the loop woken only
when it is idle) or from the loop itself (`append`). Everything else runs on the loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import operator
import random
import threading
from collections.abc import Awaitable, Callable
from typing import Any, cast

import structlog

from stream.client.admission import check_payload, with_attributes
from stream.client.append_window import AnyFuture, AppendWindow
from stream.client.attributes import HeadersArg
from stream.client.ensemble_change_job import change_ensemble
from stream.client.futures import AppendFuture
from stream.client.open_fragment import OpenFragment
from stream.client.options import WriterOptions
from stream.client.pipeline import AddPipeline
from stream.client.ports import BookieTransport, MetadataPort, WallClock
from stream.client.producer import producer_gate
from stream.client.recovery import Takeover, TakeoverResult, WriterIdentity
from stream.client.roll_job import roll
from stream.client.takeover_signals import Fenced
from stream.client.timestamps import stamp
from stream.client.writer_state import StepFn, Superseded, WriterState
from stream.errors import (
    EntryTrimmedError,
    InvalidArgumentError,
    InvalidTermError,
    StreamError,
    StreamNotFoundError,
    WriterClosedError,
)
from stream.framing.prepare import (
    AttributedPayload,
    PreparedEntry,
    prepare_entries,
    prepare_mixed_entries,
    prepare_sequenced_entries,
)
from stream.metadata.model import validate_producer_id
from stream.protocol import (
    DEFAULT_MAX_ENTRY_BYTES,
    FragmentEnsemble,
    max_entry_bytes,
)
from stream.protocol.writer_lifecycle import Effect, Event, step

log = structlog.get_logger(__name__)

# Entries moved from the queue into the pipeline per loop turn, so that answers get processed
# between large runs of appends.
_DRAIN_MAX_ENTRIES = 4096
# Appends taken from the queue at a time by a drain (a run prepared and added as a whole).
_DRAIN_RUN_ENTRIES = 256
_second = operator.itemgetter(1)

# What a job's unexpected exception is reported as: (message prefix, log event).
_JOB_NAMES = {
    Event.CHANGE_ENDED: ("ensemble change", "writer.ensemble_change_failed"),
    Event.ROLL_ENDED: ("fragment roll", "writer.roll_failed"),
}


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
        self._options = options or WriterOptions()
        # The lifecycle, the term with its pipeline and the open fragment, shared with the jobs.
        self._state = WriterState(
            name,
            transport=transport,
            metadata=metadata,
            clock=clock,
            rng=rng,
            options=self._options,
            reengage=reengage,
        )
        self._identity = identity or WriterIdentity(f"writer-{rng.getrandbits(48):012x}")
        self._is_leader = is_leader
        self._producer_id = producer_id
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._window = AppendWindow(self._options.window_entries)
        # Set (for good) by the first append with attributes: until then every queued payload
        # is plain bytes, prepared by the fastest path without looking at each.
        self._attributes_seen = False
        # Larger payloads are refused before they are sent: a bookie would answer BAD_REQUEST,
        # which counts as its failure, and replacing every member fails the writer.
        self._max_entry_bytes = DEFAULT_MAX_ENTRY_BYTES
        self._idle = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._age_timer: asyncio.TimerHandle | None = None
        # The stream's last entry timestamp: entries are stamped at least this, so that
        # timestamps never go backwards within the stream, across terms and clocks.
        self._last_ts: int | None = None

    # ------------------------------------------------------------------ views

    @property
    def term(self) -> int:
        """Returns the writer's current term."""
        return self._state.term

    @property
    def stream_id(self) -> int:
        assert self._state.meta is not None
        return self._state.meta.id

    @property
    def last_add_confirmed(self) -> int:
        """Returns the LAC: every id up to it is acknowledged."""
        pipeline = self._state.pipeline
        return -1 if pipeline is None else pipeline.lac

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
        if self._state.gate is None:
            raise InvalidArgumentError("not a producer writer (no producer_id)", stream=self.name)
        return self._state.gate.last_sequence

    @property
    def error(self) -> StreamError | None:
        """Returns the error that stopped the writer, if any."""
        return self._state.error

    # ------------------------------------------------------------------ open

    async def open(self) -> None:
        """Takes the stream over (new term, recovery) and gets ready to append."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._max_entry_bytes = max_entry_bytes(await self._state.metadata.available_bookies())
        result = await self._takeover()
        self._install(result)
        self._idle = True

    async def _takeover(self) -> TakeoverResult:
        state = self._state
        return await Takeover(
            self.name,
            transport=state.transport,
            metadata=state.metadata,
            clock=state.clock,
            rng=state.rng,
            options=self._options,
            identity=self._identity,
            producer_id=self._producer_id,
        ).run()

    def _install(self, result: TakeoverResult) -> None:
        state = self._state
        state.meta, state.version, state.term = result.meta, result.version, result.term
        if self._producer_id is not None:
            state.gate = producer_gate(self._producer_id, result)
        fragment = result.last_fragment
        pipeline = AddPipeline(
            transport=state.transport,
            owner=self,
            stream_id=result.meta.id,
            term=result.term,
            config=result.meta.quorum,
            fragments=[FragmentEnsemble(fragment.first_entry_id, fragment.ensemble)],
            last_entry_id=result.last_entry_id,
            options=self._options,
            max_in_flight=self._options.window_entries,
        )
        state.pipeline = pipeline
        state.fragment = OpenFragment(
            fragment,
            payload_bytes=result.written_bytes,
            first_ts=result.first_timestamp_ms,
            first_known=(
                result.first_timestamp_ms is not None
                or result.last_entry_id < fragment.first_entry_id
            ),
            last_ts=result.last_timestamp_ms,
        )
        if result.last_timestamp_ms is not None:
            self._last_ts = max(self._last_ts or 0, result.last_timestamp_ms)
        # Readers see the recovered entries (up to the no-op) without waiting for an add.
        pipeline.schedule_explicit_lac()
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
        state = self._state
        queued: bytes | AttributedPayload = payload
        if type(payload) is not bytes or len(payload) > self._max_entry_bytes:
            queued = payload = check_payload(payload, self._max_entry_bytes, self.name)
        if key is not None or headers or sequence is not None or state.gate is not None:
            queued = self._with_attributes(payload, key, headers, sequence)
            if queued.sequence < 0:  # a duplicate: nothing to write
                done: AppendFuture[int] = AppendFuture()
                done.set_result(-queued.sequence - 2)
                return done
        window = self._window
        ticket = next(window.tickets)
        if ticket >= window.completed + window.size:
            window.wait_room_threadsafe(ticket, self._raise_if_stopped)
        if state.error is not None or state.life.closing:
            self._raise_if_stopped()
        future: AppendFuture[int] = AppendFuture()
        window.queue.append((queued, future))
        if self._idle or state.error is not None:
            self._idle = False
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._drain)
        return future

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
        checked = check_payload(payload, self._max_entry_bytes, self.name)
        queued: bytes | AttributedPayload = checked
        gate = self._state.gate
        if key is not None or headers or sequence is not None or gate is not None:
            queued = self._with_attributes(checked, key, headers, sequence)
            if queued.sequence < 0:  # a duplicate: nothing to write
                assert self._loop is not None
                done: asyncio.Future[int] = self._loop.create_future()
                done.set_result(-queued.sequence - 2)
                return done
        self._raise_if_stopped()
        window = self._window
        ticket = next(window.tickets)
        # A producer's appends enter the queue in the order their sequences were admitted.
        if ticket < window.completed + window.size or gate is not None:
            return self._enqueue(queued)
        return self._append_when_room(queued, ticket)

    def _with_attributes(
        self,
        payload: bytes,
        key: bytes | None,
        headers: HeadersArg | None,
        sequence: int | None,
    ) -> AttributedPayload:
        """Returns `payload` with its checked attributes (`admission.with_attributes`), and
        sends every later drain through the path that looks for them (set before the payload
        is queued, so a drain that takes it sees the flag); not for a duplicate."""
        attributed = with_attributes(
            payload,
            key,
            headers,
            sequence,
            gate=self._state.gate,
            max_entry_bytes=self._max_entry_bytes,
            stream=self.name,
        )
        if attributed.sequence >= 0:
            self._attributes_seen = True
        return attributed

    async def _append_when_room(self, payload: bytes | AttributedPayload, ticket: int) -> int:
        await self._window.wait_room(ticket, self._raise_if_stopped)
        return await self._enqueue(payload)

    def _enqueue(self, payload: bytes | AttributedPayload) -> asyncio.Future[int]:
        assert self._loop is not None
        future: asyncio.Future[int] = self._loop.create_future()
        self._window.queue.append((payload, future))
        if self._idle:
            self._idle = False
            self._loop.call_soon(self._drain)
        return future

    def _raise_if_stopped(self) -> None:
        error = self._state.error
        if error is None and self._state.life.closing:
            error = WriterClosedError("writer is closed", stream=self.name)
        if error is not None:
            raise error

    def _raise_error(self) -> None:
        if self._state.error is not None:
            raise self._state.error

    def _blocked(self) -> bool:
        pipeline = self._state.pipeline
        return pipeline is None or self._state.life.blocked or pipeline.closed

    def _drain(self) -> None:
        """Moves queued appends into the pipeline (entry ids, checksums, write sets) and sends
        them; stops at a full pipeline, a full fragment, or a change in progress."""
        self._idle = False
        state = self._state
        if state.error is not None:
            self._window.fail_queued(state.error)
            return
        if self._blocked():
            return  # whoever unblocks calls _drain again
        pipeline = state.pipeline
        fragment = state.fragment
        assert pipeline is not None and state.meta is not None and fragment is not None
        queue = self._window.queue
        now_ms = stamp(state.clock, self._last_ts)
        added = 0
        added_bytes = 0
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
            fragment_fits = fragment.room(
                prefix_bytes, added_bytes, pipeline.next_entry_id, state.meta, state.clock
            )
            count = min(fits, fragment_fits)
            if count < wanted:
                queue.extendleft(reversed(taken[count:]))
                del payloads[count:], taken[count:]
            if count:
                self._add_run(pipeline, payloads, taken, now_ms)
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
            if fragment.first_ts is None:
                fragment.first_ts = now_ms
                self._arm_age_timer()
            fragment.last_ts = self._last_ts = now_ms
            fragment.bytes += added_bytes
            pipeline.flush()
        if not queue:
            self._idle = True
            if queue:  # an append raced with the flag
                self._idle = False
                assert self._loop is not None
                self._loop.call_soon(self._drain)

    def _add_run(
        self,
        pipeline: AddPipeline,
        payloads: list[bytes | AttributedPayload],
        taken: list[tuple[bytes | AttributedPayload, AnyFuture]],
        now_ms: int,
    ) -> None:
        """Prepares `payloads` (of the appends `taken` from the queue) as entries, adds them to
        `pipeline` and moves their futures to the unresolved ones."""
        state = self._state
        assert state.meta is not None
        gate = state.gate
        entries: list[PreparedEntry]
        first_id = pipeline.next_entry_id
        if gate is not None:
            # A producer writer queues every append with its sequence.
            sequenced = cast(list[AttributedPayload], payloads)
            entries = prepare_sequenced_entries(state.meta.id, first_id, now_ms, sequenced)
            gate.assigned(first_id, [p.sequence - 1 for p in sequenced])
        elif self._attributes_seen:
            entries = prepare_mixed_entries(state.meta.id, first_id, now_ms, payloads)
        else:
            # No append had attributes yet: every payload is plain bytes.
            plain = cast(list[bytes], payloads)
            entries = prepare_entries(state.meta.id, first_id, now_ms, plain)
        pipeline.add_run(entries)
        window = self._window
        if not window.unresolved:
            window.unresolved_first_id = entries[0].entry_id
        window.unresolved.extend(map(_second, taken))

    def _arm_age_timer(self) -> None:
        meta = self._state.meta
        assert meta is not None and self._loop is not None
        if meta.fragment_max_age_s is None:
            return
        if self._age_timer is not None:
            self._age_timer.cancel()
        self._age_timer = self._loop.call_later(meta.fragment_max_age_s, self._on_age)

    def _on_age(self) -> None:
        """Rolls an idle fragment whose first entry got too old (retention needs it closed)."""
        self._age_timer = None
        state = self._state
        if state.error is not None or state.life.closing or self._blocked():
            return
        assert state.pipeline is not None and state.fragment is not None and state.meta
        if state.pipeline.next_entry_id > state.fragment.fragment.first_entry_id:
            if state.fragment.too_old(state.meta, state.clock):
                self._step(Event.FRAGMENT_FULL)
            else:
                self._arm_age_timer()

    # ------------------------------------------------------------------ pipeline events

    def on_acknowledged(self, entry_ids: list[int]) -> None:
        """Resolves the futures of the newly acknowledged entries and frees their window."""
        self._window.resolve(entry_ids[-1])
        pipeline = self._state.pipeline
        assert pipeline is not None
        pipeline.schedule_explicit_lac()

    def on_fully_replicated(self) -> None:
        """Drains more appends: the pipeline's room is bounded by LAFR, not the LAC."""
        if self._window.queue and not self._idle:
            self._drain()

    def on_bookie_failed(self, bookie_id: str, reason: str) -> None:
        self._step(Event.BOOKIE_FAILED)

    def on_invalid_term(self, bookie_id: str, bookie_term: int) -> None:
        self._on_fenced(bookie_term)

    def on_trimmed(self, bookie_id: str, message: str) -> None:
        if Effect.START_TRIM_CHECK in self._step(Event.TRIMMED):
            self._start_task(self._fail_trimmed(bookie_id, message))

    def on_error(self, error: Exception) -> None:
        self._fail(StreamError(f"writer failed: {error!r}", stream=self.name))

    async def _fail_trimmed(self, bookie_id: str, message: str) -> None:
        """Stops the writer with the reason its entries were trimmed: the stream is gone
        (`StreamNotFoundError`; deleting it trims its bookies) or was trimmed past them
        (`EntryTrimmedError`)."""
        state = self._state
        assert state.meta is not None
        stream_id = state.meta.id
        try:
            meta, _, _ = await state.metadata.get_snapshot(stream_id)
        except StreamNotFoundError:
            self._fail(
                StreamNotFoundError(
                    "the stream was deleted while this writer had it open",
                    stream=self.name,
                    stream_id=stream_id,
                    term=state.term,
                )
            )
            return
        except StreamError as e:
            log.warning("writer.trim_check_failed", stream=self.name, error=str(e))
            meta = state.meta
        self._fail(
            EntryTrimmedError(
                "entries being written were trimmed under the writer",
                stream=self.name,
                term=state.term,
                bookie=bookie_id,
                first_entry_id=meta.first_entry_id,
                detail=message,
            )
        )

    def _on_fenced(self, current_term: int) -> None:
        state = self._state
        if state.life.stopped or state.life.reengaging:
            return
        error = InvalidTermError(
            "another writer took over the stream",
            term=state.term,
            current_term=current_term,
            stream=self.name,
        )
        log.warning("writer.fenced", stream=self.name, term=state.term, current_term=current_term)
        # Fails the writer, or closes the pipeline and takes the stream over in a new term.
        self._step(Event.FENCED, error)

    # ------------------------------------------------------------------ the lifecycle's effects

    def _step(self, event: Event, error: StreamError | None = None) -> tuple[Effect, ...]:
        """Feeds `event` to the lifecycle and carries out the effects it returns (`error`: what
        fails the appends, for the events that fail some); returns the effects, so that a job
        goes on only when granted (`REPLACE_BOOKIE`, `COMMIT_ROLL`, `START_TRIM_CHECK`)."""
        state = self._state
        state.life, effects = step(state.life, event)
        for effect in effects:
            if effect is Effect.DRAIN:
                self._drain()
            elif effect is Effect.START_ENSEMBLE_CHANGE:
                self._start_task(self._run_job(change_ensemble, Event.CHANGE_ENDED))
            elif effect is Effect.START_ROLL:
                self._start_task(self._run_job(roll, Event.ROLL_ENDED))
            elif effect is Effect.CLOSE_PIPELINE:
                assert isinstance(error, InvalidTermError)
                self._close_pipeline(error)
            elif effect is Effect.START_REENGAGE:
                assert isinstance(error, InvalidTermError)
                self._start_task(self._reengage(error))
            elif effect is Effect.FAIL_WRITER:
                assert error is not None
                self._stop(error)
        return effects

    def _start_task(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_job(
        self, job: Callable[[WriterState, StepFn], Awaitable[None]], ended: Event
    ) -> None:
        """Runs the ensemble change or the roll, the one funnel for their exceptions: a newer
        term fences the writer (`_on_fenced`: fails it, or re-engages), a superseded pipeline
        drops the job, any other error stops the writer; `ended` goes to the lifecycle last."""
        try:
            await job(self._state, self._step)
        except Superseded:
            pass  # the writer moved on to another term: its own pipeline decides
        except InvalidTermError as e:
            self._on_fenced(e.current_term)  # type: ignore[attr-defined]
        except Fenced as e:
            self._on_fenced(e.bookie_term)
        except StreamError as e:
            self._fail(e)
        except Exception as e:
            what, log_event = _JOB_NAMES[ended]
            log.exception(log_event, stream=self.name)
            self._fail(StreamError(f"{what} failed: {e!r}", stream=self.name))
        finally:
            self._step(ended)

    async def _reengage(self, error: InvalidTermError) -> None:
        """Takes the stream over in a new term (unless no longer the leader) and continues on
        it; queued appends wait for it."""
        try:
            if self._is_leader is not None and not self._is_leader():
                self._fail(error)
                return
            result = await self._takeover()
            if self._state.error is not None or self._state.life.closing:
                return
            self._install(result)
            log.info("writer.reengaged", stream=self.name, term=self._state.term)
        except StreamError as e:
            self._fail(e)
        except Exception as e:
            log.exception("writer.reengage_failed", stream=self.name)
            self._fail(StreamError(f"re-engaging failed: {e!r}", stream=self.name))
        finally:
            self._step(Event.REENGAGE_ENDED)

    # ------------------------------------------------------------------ stopping

    def _close_pipeline(self, error: StreamError) -> None:
        """Closes the pipeline and fails the appends in it with `error`."""
        if self._state.pipeline is not None:
            self._state.pipeline.close()
        self._window.fail_unresolved(error)

    def _fail(self, error: StreamError) -> None:
        """Stops the writer for good (unless stopped already): every pending and later append
        fails with `error`."""
        closed = isinstance(error, WriterClosedError)
        self._step(Event.STOPPED if closed else Event.FAILED, error)

    def _stop(self, error: StreamError) -> None:
        self._state.error = error
        if not isinstance(error, WriterClosedError):
            log.warning("writer.stopped", stream=self.name, term=self._state.term, error=str(error))
        self._close_pipeline(error)
        self._window.fail_queued(error)
        if self._age_timer is not None:
            self._age_timer.cancel()
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()

    async def flush(self) -> None:
        """Returns once every append queued so far is acknowledged; raises the writer's error
        when it stopped."""
        await self._window.wait_answered(self._raise_error)

    def abort(self) -> None:
        """Stops the writer at once, without flushing: pending and later appends fail with
        `WriterClosedError`. Appends not yet acknowledged may or may not be kept: the next
        writer's takeover decides. `close()` still releases the writer's resources."""
        self._fail(WriterClosedError("writer aborted", stream=self.name))

    async def close(self) -> None:
        """Flushes, publishes the final LAC to the ensemble, closes the streams and
        unregisters the writer. The stream stays OPEN in this term: the next writer takes
        over with a new term."""
        state = self._state
        if state.life.closing:
            return
        try:
            if state.error is None:
                await self.flush()
        finally:
            self._step(Event.CLOSE_REQUESTED)
        pipeline = state.pipeline
        if pipeline is not None and state.error is None and not pipeline.closed:
            await self._publish_final_lac(pipeline)
        self._fail(WriterClosedError("writer is closed", stream=self.name))
        if state.meta is not None:
            try:
                await state.metadata.unregister_writer(state.meta.id)
            except StreamError as e:
                log.warning("writer.unregister_failed", stream=self.name, error=str(e))
        log.info("writer.closed", stream=self.name, term=state.term)

    async def _publish_final_lac(self, pipeline: AddPipeline) -> None:
        """Sends explicit LACs until the ensemble knows every acknowledged entry and no batch is
        in flight, or `add_timeout_s` passed, or the writer stopped."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.add_timeout_s
        if pipeline.lac_behind():
            pipeline.schedule_explicit_lac()
        while (
            (pipeline.lac_behind() or pipeline.inflight_batches())
            and loop.time() < deadline
            and self._state.error is None
        ):
            if pipeline.lac_behind():
                pipeline.schedule_explicit_lac()
            await asyncio.sleep(self._options.explicit_lac_delay_s)
