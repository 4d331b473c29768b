"""The writer's drain: moves queued appends into the add pipeline (entry ids, timestamps,
checksums, write sets) in runs, up to the pipeline's room and the open fragment's bounds, and
asks for a roll once the fragment is full (by size, or by age on a timer)."""

from __future__ import annotations

import asyncio
import itertools
import operator
from collections import deque
from itertools import repeat
from typing import cast

from stream.client.append_window import AnyFuture, AppendWindow
from stream.client.pipeline import AddPipeline
from stream.client.timestamps import stamp
from stream.client.writer_state import StepFn, WriterState
from stream.framing.prepare import (
    AttributedPayload,
    PreparedEntry,
    prepare_entries,
    prepare_mixed_entries,
    prepare_sequenced_entries,
)
from stream.protocol.writer_lifecycle import Event

# Entries moved from the queue into the pipeline per loop turn, so that answers get processed
# between large runs of appends.
_DRAIN_MAX_ENTRIES = 4096
# Appends taken from the queue at a time by a drain (a run prepared and added as a whole).
_DRAIN_RUN_ENTRIES = 256
_first = operator.itemgetter(0)
_second = operator.itemgetter(1)
_popleft = deque.popleft


class Drain:
    """One writer's drain. `idle` says the loop must be woken for the next append (any thread
    reads it); `run` is called on the loop thread."""

    def __init__(self, state: WriterState, window: AppendWindow, step: StepFn) -> None:
        self._state = state
        self._window = window
        self._step = step
        self.loop: asyncio.AbstractEventLoop | None = None  # set by the writer's open()
        self.idle = False
        # Set (for good) by the first append with attributes: until then every queued payload
        # is plain bytes, prepared by the fastest path without looking at each.
        self.attributes_seen = False
        # The stream's last entry timestamp: entries are stamped at least this, so that
        # timestamps never go backwards within the stream, across terms and clocks.
        self.last_ts: int | None = None
        self._age_timer: asyncio.TimerHandle | None = None

    def blocked(self) -> bool:
        """Returns whether appends must stay queued (no pipeline, or a job owns its shape)."""
        pipeline = self._state.pipeline
        return pipeline is None or self._state.life.blocked or pipeline.closed

    def run(self) -> None:
        """Moves queued appends into the pipeline and sends them; stops at a full pipeline, a
        full fragment, or a change in progress (whoever unblocks runs it again)."""
        self.idle = False
        state = self._state
        if state.error is not None:
            self._window.fail_queued(state.error)
            return
        if self.blocked():
            return
        pipeline = state.pipeline
        fragment = state.fragment
        assert pipeline is not None and state.meta is not None and fragment is not None
        assert self.loop is not None
        queue = self._window.queue
        now_ms = stamp(state.clock, self.last_ts)
        added = 0
        added_bytes = 0
        while queue and added < _DRAIN_MAX_ENTRIES:
            # Runs of entries: each is checked against the window and the fragment's bounds
            # as a whole (exactly as entry by entry), then prepared and added in C-level loops.
            wanted = min(len(queue), _DRAIN_MAX_ENTRIES - added, _DRAIN_RUN_ENTRIES)
            if pipeline.pending.room() <= 0:
                break
            taken = list(map(_popleft, repeat(queue, wanted)))  # C-level loops
            payloads = list(map(_first, taken))
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
            self.loop.call_soon(self.run)
        if added:
            if fragment.first_ts is None:
                fragment.first_ts = now_ms
                self._arm_age_timer()
            fragment.last_ts = self.last_ts = now_ms
            fragment.bytes += added_bytes
            pipeline.flush()
        if not queue:
            self.idle = True
            if queue:  # an append raced with the flag
                self.idle = False
                self.loop.call_soon(self.run)

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
        elif self.attributes_seen:
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

    # ------------------------------------------------------------------ the age limit

    def _arm_age_timer(self) -> None:
        meta = self._state.meta
        assert meta is not None and self.loop is not None
        if meta.fragment_max_age_s is None:
            return
        if self._age_timer is not None:
            self._age_timer.cancel()
        self._age_timer = self.loop.call_later(meta.fragment_max_age_s, self._on_age)

    def _on_age(self) -> None:
        """Rolls an idle fragment whose first entry got too old (retention needs it closed)."""
        self._age_timer = None
        state = self._state
        if state.error is not None or state.life.closing or self.blocked():
            return
        assert state.pipeline is not None and state.fragment is not None and state.meta
        if state.pipeline.next_entry_id > state.fragment.fragment.first_entry_id:
            if state.fragment.too_old(state.meta, state.clock):
                self._step(Event.FRAGMENT_FULL)
            else:
                self._arm_age_timer()

    def stop(self) -> None:
        """Cancels the age timer (the writer stopped)."""
        if self._age_timer is not None:
            self._age_timer.cancel()
