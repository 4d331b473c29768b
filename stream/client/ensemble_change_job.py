"""The writer's ensemble change job (docs/design.md §5 "Ensemble changes"): replaces every
failed bookie of the ensemble, one at a time, each change committed by CAS before the
replacement gets its entries. The lifecycle grants each replacement (`REPLACE_BOOKIE`)."""

from __future__ import annotations

import asyncio

from stream.client.bookie_placement import replace_bookie, replacement_choice
from stream.client.open_fragment import OpenFragment
from stream.client.pipeline import AddPipeline
from stream.client.writer_state import StepFn, WriterState
from stream.metadata.model import Fragment, StreamMeta
from stream.protocol.writer_lifecycle import Effect, Event


async def change_ensemble(state: WriterState, step: StepFn) -> None:
    """Replaces the failed bookies of `state`'s pipeline until none is left, the writer stopped
    or its pipeline closed."""
    while state.error is None:
        if Effect.REPLACE_BOOKIE not in step(Event.CHANGE_NEXT):
            # A roll is closing its fragment: a change now would alter the ensemble it
            # closes it with (found by the simulator, seed 1106: an acknowledged entry
            # lost).
            await asyncio.sleep(0.01)
            continue
        pipeline = state.pipeline
        if pipeline is None or pipeline.closed:
            return
        failed = replacement_choice(
            pipeline.ensemble, pipeline.failed, pipeline.pending.pinned_bookies(), state.options
        )
        if failed is None:
            return
        await _replace(state, pipeline, failed)


async def _replace(state: WriterState, pipeline: AddPipeline, failed: str) -> None:
    """Replaces `failed` (`replace_bookie`), commits the change by CAS, then lets the
    replacement have its entries."""
    meta = state.meta
    assert meta is not None
    replaced = await replace_bookie(
        pipeline,
        failed,
        pipeline.failed,
        state.placement(),
        ack_quorum=meta.ack_quorum,
        moot=lambda: state.error is not None or state.superseded(pipeline),
    )
    if replaced is None:
        return
    change, replacement = replaced
    fragment = Fragment(change.first_entry_id, pipeline.ensemble, created_ms=state.clock.now_ms())

    async def add_fragment(version: int) -> tuple[StreamMeta, int]:
        return await state.metadata.add_fragment(meta.id, version, fragment, change.replaces_last)

    await state.commit(add_fragment, pipeline)
    held = pipeline.held.get(change.first_entry_id)
    previous = state.fragment
    state.fragment = OpenFragment(
        fragment,
        payload_bytes=pipeline.held_payload_bytes(change.first_entry_id),
        first_ts=None if held is None else held.timestamp_ms,
        # Unchanged: the last entry written, whichever fragment now holds it.
        last_ts=None if previous is None else previous.last_ts,
    )
    pipeline.unstored_away.discard(failed)  # the metadata holds the change now
    pipeline.unblock(replacement)
