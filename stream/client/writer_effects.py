"""The writer's loop-thread side (docs/design.md §5 "Writing"): the add pipeline's owner, which
turns what the pipeline reports into lifecycle events (`stream.protocol.writer_lifecycle`) and
carries out the effects `step` returns: drain, start the ensemble change or the roll job (one
funnel for their exceptions), close the term's pipeline and re-engage in a new term, or stop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from stream.client.append_window import AppendWindow
from stream.client.drain import Drain
from stream.client.ensemble_change_job import change_ensemble
from stream.client.open_fragment import OpenFragment
from stream.client.options import WriterOptions
from stream.client.pipeline import AddPipeline
from stream.client.producer import producer_gate
from stream.client.recovery import Takeover, TakeoverResult, WriterIdentity
from stream.client.roll_job import roll
from stream.client.takeover_signals import Fenced
from stream.client.writer_state import StepFn, Superseded, WriterState
from stream.errors import (
    EntryTrimmedError,
    InvalidTermError,
    StreamError,
    StreamNotFoundError,
    WriterClosedError,
)
from stream.logs import get_logger
from stream.protocol import FragmentEnsemble
from stream.protocol.writer_lifecycle import Effect, Event, step

log = get_logger(__name__)

# What a job's unexpected exception is reported as: (message prefix, log event).
_JOB_NAMES = {
    Event.CHANGE_ENDED: ("ensemble change", "writer.ensemble_change_failed"),
    Event.ROLL_ENDED: ("fragment roll", "writer.roll_failed"),
}


class WriterEffects:
    """One writer's lifecycle executor and pipeline owner (everything on the loop thread)."""

    def __init__(
        self,
        state: WriterState,
        window: AppendWindow,
        *,
        identity: WriterIdentity,
        producer_id: str | None,
        is_leader: Callable[[], bool] | None,
    ) -> None:
        self.name = state.name
        self._state = state
        self._options: WriterOptions = state.options
        self._window = window
        self._identity = identity
        self._producer_id = producer_id
        self._is_leader = is_leader
        self.drain = Drain(state, window, self.step)
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ taking over

    async def takeover(self) -> TakeoverResult:
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

    def install(self, result: TakeoverResult) -> None:
        """Continues in the term `result` opened: a new pipeline on its last fragment."""
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
            self.drain.last_ts = max(self.drain.last_ts or 0, result.last_timestamp_ms)
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

    # ------------------------------------------------------------------ pipeline events

    def on_acknowledged(self, entry_ids: range) -> None:
        """Resolves the futures of the newly acknowledged entries and frees their window."""
        self._window.resolve(entry_ids[-1])
        pipeline = self._state.pipeline
        assert pipeline is not None
        pipeline.schedule_explicit_lac()

    def on_fully_replicated(self) -> None:
        """Drains more appends: the pipeline's room is bounded by LAFR, not the LAC."""
        if self._window.queue and not self.drain.idle:
            self.drain.run()

    def on_bookie_failed(self, bookie_id: str, reason: str) -> None:
        self.step(Event.BOOKIE_FAILED)

    def on_invalid_term(self, bookie_id: str, bookie_term: int) -> None:
        self._on_fenced(bookie_term)

    def on_trimmed(self, bookie_id: str, message: str) -> None:
        if Effect.START_TRIM_CHECK in self.step(Event.TRIMMED):
            self._start_task(self._fail_trimmed(bookie_id, message))

    def on_error(self, error: Exception) -> None:
        self.fail(StreamError(f"writer failed: {error!r}", stream=self.name))

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
            self.fail(
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
        self.fail(
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
        self.step(Event.FENCED, error)

    # ------------------------------------------------------------------ the lifecycle's effects

    def step(self, event: Event, error: StreamError | None = None) -> tuple[Effect, ...]:
        """Feeds `event` to the lifecycle and carries out the effects it returns (`error`: what
        fails the appends, for the events that fail some); returns the effects, so that a job
        goes on only when granted (`REPLACE_BOOKIE`, `COMMIT_ROLL`, `START_TRIM_CHECK`)."""
        state = self._state
        state.life, effects = step(state.life, event)
        for effect in effects:
            if effect is Effect.DRAIN:
                self.drain.run()
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
            await job(self._state, self.step)
        except Superseded:
            pass  # the writer moved on to another term: its own pipeline decides
        except InvalidTermError as e:
            self._on_fenced(e.context["current_term"])
        except Fenced as e:
            self._on_fenced(e.bookie_term)
        except StreamError as e:
            self.fail(e)
        except Exception as e:
            what, log_event = _JOB_NAMES[ended]
            log.exception(log_event, stream=self.name)
            self.fail(StreamError(f"{what} failed: {e!r}", stream=self.name))
        finally:
            self.step(ended)

    async def _reengage(self, error: InvalidTermError) -> None:
        """Takes the stream over in a new term (unless no longer the leader) and continues on
        it; queued appends wait for it."""
        try:
            if self._is_leader is not None and not self._is_leader():
                self.fail(error)
                return
            result = await self.takeover()
            if self._state.error is not None or self._state.life.closing:
                return
            self.install(result)
            log.info("writer.reengaged", stream=self.name, term=self._state.term)
        except StreamError as e:
            self.fail(e)
        except Exception as e:
            log.exception("writer.reengage_failed", stream=self.name)
            self.fail(StreamError(f"re-engaging failed: {e!r}", stream=self.name))
        finally:
            self.step(Event.REENGAGE_ENDED)

    # ------------------------------------------------------------------ stopping

    def fail(self, error: StreamError) -> None:
        """Stops the writer for good (unless stopped already): every pending and later append
        fails with `error`."""
        closed = isinstance(error, WriterClosedError)
        self.step(Event.STOPPED if closed else Event.FAILED, error)

    def _close_pipeline(self, error: StreamError) -> None:
        """Closes the pipeline and fails the appends in it with `error`."""
        if self._state.pipeline is not None:
            self._state.pipeline.close()
        self._window.fail_unresolved(error)

    def _stop(self, error: StreamError) -> None:
        self._state.error = error
        if not isinstance(error, WriterClosedError):
            log.warning("writer.stopped", stream=self.name, term=self._state.term, error=str(error))
        self._close_pipeline(error)
        self._window.fail_queued(error)
        self.drain.stop()
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
