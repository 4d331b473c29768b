"""The writer's fragment lifecycle as a pure state machine (etcd raft style): `step(state, event)`
returns the next state and the effects the asyncio writer must carry out, in order.

The writer's background jobs overlap: a roll may wait for its fragment to replicate while an
ensemble change runs, and a re-engagement may start while both are still winding down. So the
state is a few small slots, one per job, and `Phase` is the single name a reader sees. What the
slots guarantee (tests/unit/protocol/test_writer_lifecycle.py walks every reachable state with
every event):

- at most one metadata change in flight: a bookie replacement never runs while a roll commits
  (the roll closes its fragment with the ensemble it saw; seed 1106 lost an acknowledged entry
  when a change slipped in), and a roll only starts committing when no change is under way;
- closed and failed are terminal: no event leaves them or yields an effect;
- `FAIL_WRITER` (every pending append fails) is emitted exactly once, on the way into a terminal
  state, and `CLOSE_PIPELINE` (appends in flight fail) only while the writer is live.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass


class ChangeSlot(enum.Enum):
    """The ensemble change job."""

    NONE = "none"
    # Started (a bookie failed); not yet allowed to replace one, or waiting for a roll's commit.
    WAITING = "waiting"
    REPLACING = "replacing"


class RollSlot(enum.Enum):
    """The capacity roll job."""

    NONE = "none"
    # Waiting for the full fragment to reach its write sets and for any change to end.
    WAITING = "waiting"
    COMMITTING = "committing"  # placing the next ensemble and closing the fragment in metadata


class End(enum.Enum):
    NONE = "none"
    CLOSED = "closed"  # closed or aborted by its user
    FAILED = "failed"  # stopped by an error (fenced for good, superseded, a bookie or CAS error)


class Phase(enum.Enum):
    """The one name of the writer's state: the first that applies, in this order."""

    CLOSED = "closed"
    FAILED = "failed"
    REENGAGING = "reengaging"
    COMMITTING_ROLL = "committing_roll"
    CHANGING_ENSEMBLE = "changing_ensemble"
    ROLLING = "rolling"
    CLOSING = "closing"
    APPENDING = "appending"


class Event(enum.Enum):
    BOOKIE_FAILED = "bookie_failed"  # the pipeline lost a bookie of the ensemble
    CHANGE_NEXT = "change_next"  # the change job asks to replace its next failed bookie
    CHANGE_ENDED = "change_ended"  # the change job returned, whatever the outcome
    FRAGMENT_FULL = "fragment_full"  # by entries, bytes or age
    ROLL_READY = "roll_ready"  # the full fragment reached its write sets: asks to commit
    ROLL_ENDED = "roll_ended"
    FENCED = "fenced"  # a bookie or the metadata CAS showed a newer term
    REENGAGE_ENDED = "reengage_ended"  # the takeover of a new term returned (or gave up)
    TRIMMED = "trimmed"  # a bookie answered TRIMMED
    CLOSE_REQUESTED = "close_requested"  # `close()` flushed what it could
    STOPPED = "stopped"  # closed or aborted: pending appends fail with "closed"
    FAILED = "failed"  # an error stops the writer: pending appends fail with it


class Effect(enum.Enum):
    DRAIN = "drain"  # move queued appends into the pipeline and send them
    START_ENSEMBLE_CHANGE = "start_ensemble_change"
    REPLACE_BOOKIE = "replace_bookie"  # the change job may place, truncate and CAS a bookie
    START_ROLL = "start_roll"
    COMMIT_ROLL = "commit_roll"  # the roll job may place, truncate and CAS the next fragment
    CLOSE_PIPELINE = "close_pipeline"  # the term is over: appends in flight fail
    START_REENGAGE = "start_reengage"  # take the stream over in a new term
    START_TRIM_CHECK = "start_trim_check"  # find out why (deleted or trimmed), then fail
    FAIL_WRITER = "fail_writer"  # every pending and later append fails; jobs are cancelled


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """The writer's lifecycle state. `reengage`: whether a fenced writer takes the stream over
    again (fixed when the writer is built)."""

    reengage: bool = False
    change: ChangeSlot = ChangeSlot.NONE
    roll: RollSlot = RollSlot.NONE
    reengaging: bool = False
    closing: bool = False
    trim_checking: bool = False
    end: End = End.NONE

    @property
    def phase(self) -> Phase:
        """Returns the name of this state (the first of `Phase`'s order that applies)."""
        if self.end is End.CLOSED:
            return Phase.CLOSED
        if self.end is End.FAILED:
            return Phase.FAILED
        if self.reengaging:
            return Phase.REENGAGING
        if self.roll is RollSlot.COMMITTING:
            return Phase.COMMITTING_ROLL
        if self.change is not ChangeSlot.NONE:
            return Phase.CHANGING_ENSEMBLE
        if self.roll is RollSlot.WAITING:
            return Phase.ROLLING
        if self.closing:
            return Phase.CLOSING
        return Phase.APPENDING

    @property
    def stopped(self) -> bool:
        """Returns whether the writer reached a terminal state."""
        return self.end is not End.NONE

    @property
    def blocked(self) -> bool:
        """Returns whether appends must wait in the queue (a job owns the pipeline's shape)."""
        return (
            self.change is not ChangeSlot.NONE or self.roll is not RollSlot.NONE or self.reengaging
        )


Step = tuple[Lifecycle, tuple[Effect, ...]]
_NOTHING: tuple[Effect, ...] = ()


def step(state: Lifecycle, event: Event) -> Step:
    """Returns the state after `event` and the effects to carry out, in order. An event that does
    not apply in `state` returns it unchanged with no effects."""
    if event is Event.CLOSE_REQUESTED:
        # Also recorded when stopped: a second close() then returns at once.
        return dataclasses.replace(state, closing=True), _NOTHING
    if state.stopped:
        return state, _NOTHING
    return _STEPS[event](state)


def _bookie_failed(state: Lifecycle) -> Step:
    if state.change is not ChangeSlot.NONE or state.reengaging:
        return state, _NOTHING  # the running change picks it up; a new term starts afresh
    return dataclasses.replace(state, change=ChangeSlot.WAITING), (Effect.START_ENSEMBLE_CHANGE,)


def _change_next(state: Lifecycle) -> Step:
    if state.change is ChangeSlot.NONE:
        return state, _NOTHING
    if state.roll is RollSlot.COMMITTING:
        # A change now would alter the ensemble the roll is closing the fragment with.
        return dataclasses.replace(state, change=ChangeSlot.WAITING), _NOTHING
    return dataclasses.replace(state, change=ChangeSlot.REPLACING), (Effect.REPLACE_BOOKIE,)


def _change_ended(state: Lifecycle) -> Step:
    if state.change is ChangeSlot.NONE:
        return state, _NOTHING
    return dataclasses.replace(state, change=ChangeSlot.NONE), (Effect.DRAIN,)


def _fragment_full(state: Lifecycle) -> Step:
    if state.roll is not RollSlot.NONE:
        return state, _NOTHING
    return dataclasses.replace(state, roll=RollSlot.WAITING), (Effect.START_ROLL,)


def _roll_ready(state: Lifecycle) -> Step:
    if state.roll is not RollSlot.WAITING or state.change is not ChangeSlot.NONE:
        return state, _NOTHING  # a change reshapes the fragment first: the roll waits
    return dataclasses.replace(state, roll=RollSlot.COMMITTING), (Effect.COMMIT_ROLL,)


def _roll_ended(state: Lifecycle) -> Step:
    if state.roll is RollSlot.NONE:
        return state, _NOTHING
    return dataclasses.replace(state, roll=RollSlot.NONE), (Effect.DRAIN,)


def _fenced(state: Lifecycle) -> Step:
    if state.reengaging:
        return state, _NOTHING  # the takeover under way settles it
    if not state.reengage or state.closing:
        # A closing writer never takes over again (its final LAC can meet a newer term).
        return dataclasses.replace(state, end=End.FAILED), (Effect.FAIL_WRITER,)
    # Appends in flight have an unknown fate: they fail. Queued ones wait for the new term.
    return dataclasses.replace(state, reengaging=True), (
        Effect.CLOSE_PIPELINE,
        Effect.START_REENGAGE,
    )


def _reengage_ended(state: Lifecycle) -> Step:
    if not state.reengaging:
        return state, _NOTHING
    return dataclasses.replace(state, reengaging=False), (Effect.DRAIN,)


def _trimmed(state: Lifecycle) -> Step:
    if state.trim_checking:
        return state, _NOTHING
    return dataclasses.replace(state, trim_checking=True), (Effect.START_TRIM_CHECK,)


def _stopped(state: Lifecycle) -> Step:
    return dataclasses.replace(state, end=End.CLOSED), (Effect.FAIL_WRITER,)


def _failed(state: Lifecycle) -> Step:
    return dataclasses.replace(state, end=End.FAILED), (Effect.FAIL_WRITER,)


_STEPS: dict[Event, Callable[[Lifecycle], Step]] = {
    Event.BOOKIE_FAILED: _bookie_failed,
    Event.CHANGE_NEXT: _change_next,
    Event.CHANGE_ENDED: _change_ended,
    Event.FRAGMENT_FULL: _fragment_full,
    Event.ROLL_READY: _roll_ready,
    Event.ROLL_ENDED: _roll_ended,
    Event.FENCED: _fenced,
    Event.REENGAGE_ENDED: _reengage_ended,
    Event.TRIMMED: _trimmed,
    Event.STOPPED: _stopped,
    Event.FAILED: _failed,
}
