"""The stream writer's asyncio API (docs/design.md §5 "Writing"): appends checked
(`admission`) and queued within the window (`append_window`), then batched onto the add pipeline
by the drain (`drain`), acknowledged in order at AQ; flush and close. The loop-thread side, the
pipeline's owner carrying out the fragment lifecycle's effects (ensemble changes, capacity
rolls, re-engaging on INVALID_TERM), is `writer_effects`.

Appends may come from any thread (`submit_threadsafe`: a thread-safe deque, the loop woken only
when it is idle) or from the loop itself (`append`). Everything else runs on the loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading
from collections.abc import Awaitable, Callable

from stream.client.admission import check_payload, with_attributes
from stream.client.append_window import AppendWindow
from stream.client.attributes import HeadersArg
from stream.client.futures import AppendFuture
from stream.client.options import WriterOptions
from stream.client.pipeline import AddPipeline
from stream.client.ports import BookieTransport, MetadataPort, WallClock
from stream.client.recovery import WriterIdentity
from stream.client.writer_effects import WriterEffects
from stream.client.writer_state import WriterState
from stream.errors import InvalidArgumentError, StreamError, WriterClosedError
from stream.framing.prepare import AttributedPayload
from stream.logs import get_logger
from stream.metadata.model import validate_producer_id
from stream.protocol import DEFAULT_MAX_ENTRY_BYTES, max_entry_bytes
from stream.protocol.writer_lifecycle import Event

log = get_logger(__name__)


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
        self._producer_id = producer_id
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._window = AppendWindow(self._options.window_entries)
        # The loop-thread side: the pipeline's owner, the lifecycle's effects, the drain.
        self._effects = WriterEffects(
            self._state,
            self._window,
            identity=identity or WriterIdentity(f"writer-{rng.getrandbits(48):012x}"),
            producer_id=producer_id,
            is_leader=is_leader,
        )
        self._drain = self._effects.drain
        # Larger payloads are refused before they are sent: a bookie would answer BAD_REQUEST,
        # which counts as its failure, and replacing every member fails the writer.
        self._max_entry_bytes = DEFAULT_MAX_ENTRY_BYTES

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
    def pipeline(self) -> AddPipeline | None:
        """Returns the current term's add pipeline (None before the takeover), for observers
        only: the simulator's checker reads its failed and pinned bookies."""
        return self._state.pipeline

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
        self._loop = self._drain.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._max_entry_bytes = max_entry_bytes(await self._state.metadata.available_bookies())
        result = await self._effects.takeover()
        self._effects.install(result)
        self._drain.idle = True

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
        drain = self._drain
        if drain.idle or state.error is not None:
            drain.idle = False
            assert self._loop is not None
            self._loop.call_soon_threadsafe(drain.run)
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
            self._drain.attributes_seen = True
        return attributed

    async def _append_when_room(self, payload: bytes | AttributedPayload, ticket: int) -> int:
        await self._window.wait_room(ticket, self._raise_if_stopped)
        return await self._enqueue(payload)

    def _enqueue(self, payload: bytes | AttributedPayload) -> asyncio.Future[int]:
        assert self._loop is not None
        future: asyncio.Future[int] = self._loop.create_future()
        self._window.queue.append((payload, future))
        drain = self._drain
        if drain.idle:
            drain.idle = False
            self._loop.call_soon(drain.run)
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

    async def flush(self) -> None:
        """Returns once every append queued so far is acknowledged; raises the writer's error
        when it stopped."""
        await self._window.wait_answered(self._raise_error)

    def abort(self) -> None:
        """Stops the writer at once, without flushing: pending and later appends fail with
        `WriterClosedError`. Appends not yet acknowledged may or may not be kept: the next
        writer's takeover decides. `close()` still releases the writer's resources."""
        self._effects.fail(WriterClosedError("writer aborted", stream=self.name))

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
            self._effects.step(Event.CLOSE_REQUESTED)
        pipeline = state.pipeline
        if pipeline is not None and state.error is None and not pipeline.closed:
            await self._publish_final_lac(pipeline)
        self._effects.fail(WriterClosedError("writer is closed", stream=self.name))
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
