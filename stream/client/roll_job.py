"""The writer's capacity roll job (docs/design.md §5 "Fragments"): once the full fragment's
entries all reached their write sets, close it in metadata and continue on a freshly placed
ensemble. The lifecycle grants the commit (`COMMIT_ROLL`) only while no ensemble change runs."""

from __future__ import annotations

from stream.client.bookie_placement import place_ensemble
from stream.client.open_fragment import OpenFragment
from stream.client.writer_state import StepFn, WriterState
from stream.logs import get_logger
from stream.metadata.model import Fragment, ProducerChange, ProducerTerm
from stream.protocol.invariant import invariant
from stream.protocol.producers import NO_SEQUENCE, ProducerPosition
from stream.protocol.writer_lifecycle import ChangeSlot, Effect, Event

log = get_logger(__name__)


async def roll(state: WriterState, step: StepFn) -> None:
    """Closes the full fragment in metadata and continues on a freshly placed ensemble, once
    every entry of the fragment reached its whole write set."""
    pipeline = state.pipeline
    meta = state.meta
    assert pipeline is not None and meta is not None
    last = pipeline.next_entry_id - 1
    while (pipeline.lafr < last or state.life.change is not ChangeSlot.NONE) and (
        state.error is None
    ):
        if pipeline is not state.pipeline:
            return
        await pipeline.wait_progress(0.05)
    if state.error is not None or pipeline is not state.pipeline or pipeline.closed:
        return
    open_fragment = state.fragment
    assert open_fragment is not None
    if open_fragment.fragment.first_entry_id > last:
        # An ensemble change while we waited started its fragment at LAFR + 1, our
        # boundary: the full fragment is closed already, nothing is left to roll.
        return
    invariant(
        Effect.COMMIT_ROLL in step(Event.ROLL_READY),
        "a roll commits only while no ensemble change runs",
        stream=state.name,
    )
    ensemble = await place_ensemble(
        state.placement(),
        meta,
        last,
        exclude=pipeline.failed,
        members=pipeline.ensemble,
    )
    now_ms = state.clock.now_ms()
    closed = open_fragment.closed_at(last, tuple(pipeline.ensemble))
    new = Fragment(last + 1, ensemble, created_ms=now_ms)
    producers = _roll_producers(state, last, now_ms)
    await state.commit(
        lambda version: state.metadata.roll_fragment(meta.id, version, closed, new, producers),
        pipeline,
    )
    if state.gate is not None:
        state.gate.forget_before(last + 1)
    pipeline.roll(last + 1, ensemble)
    state.fragment = OpenFragment(new)
    log.info(
        "writer.rolled",
        stream=state.name,
        term=state.term,
        closed_last_entry_id=last,
        ensemble=list(ensemble),
    )


def _roll_producers(state: WriterState, last: int, now_ms: int) -> ProducerChange | None:
    """Returns what a roll closing at `last` records of the writer's producer: its last
    sequence up to there, and its term moved to the new fragment (None: not a producer)."""
    gate = state.gate
    if gate is None:
        return None
    sequence = gate.sequence_at(last)
    positions: tuple[ProducerPosition, ...] = ()
    if sequence != NO_SEQUENCE:
        positions = (ProducerPosition(gate.producer_id, sequence, last, now_ms),)
    return ProducerChange(
        positions,
        now_ms,
        int(state.options.producer_expiry_s * 1000),
        ProducerTerm(state.term, gate.producer_id, last + 1),
    )
