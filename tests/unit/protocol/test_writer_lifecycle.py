"""The writer's lifecycle machine (stream/protocol/writer_lifecycle.py): every reachable state
with every event, its invariants, the appends it leaves pending, and agreement with the boolean
flags `AsyncStreamWriter` held before (the oracle)."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator
from dataclasses import astuple

import pytest

from stream.protocol.writer_lifecycle import (
    ChangeSlot,
    Effect,
    End,
    Event,
    Lifecycle,
    Phase,
    RollSlot,
    step,
)

INITIAL = (Lifecycle(reengage=False), Lifecycle(reengage=True))


def reachable() -> set[Lifecycle]:
    """Returns every state reachable from a new writer (either reengage setting) by events."""
    seen = set(INITIAL)
    todo = deque(INITIAL)
    while todo:
        state = todo.popleft()
        for event in Event:
            new, _ = step(state, event)
            if new not in seen:
                seen.add(new)
                todo.append(new)
    return seen


STATES = reachable()


def transitions() -> Iterator[tuple[Lifecycle, Event, Lifecycle, tuple[Effect, ...]]]:
    for state in STATES:
        for event in Event:
            new, effects = step(state, event)
            yield state, event, new, effects


def test_the_walk_reaches_every_phase_and_slot() -> None:
    assert {s.phase for s in STATES} == set(Phase)
    assert {s.change for s in STATES} == set(ChangeSlot)
    assert {s.roll for s in STATES} == set(RollSlot)
    assert {s.end for s in STATES} == set(End)
    assert len(STATES) > 100


def test_every_event_is_handled_in_every_state() -> None:
    for state, event, new, effects in transitions():
        assert isinstance(new, Lifecycle), (state, event)
        assert len(set(effects)) == len(effects), (state, event, effects)


def test_never_two_metadata_changes_in_flight() -> None:
    for state in STATES:
        assert not (state.change is ChangeSlot.REPLACING and state.roll is RollSlot.COMMITTING), (
            state
        )
    for state, event, _, effects in transitions():
        if Effect.REPLACE_BOOKIE in effects:
            assert state.roll is not RollSlot.COMMITTING, (state, event)
        if Effect.COMMIT_ROLL in effects:
            # No roll commits while a change is under way, not even one waiting to replace.
            assert state.change is ChangeSlot.NONE, (state, event)


def test_jobs_are_started_only_when_none_of_their_kind_runs() -> None:
    starts = {
        Effect.START_ENSEMBLE_CHANGE: lambda s: s.change is ChangeSlot.NONE,
        Effect.START_ROLL: lambda s: s.roll is RollSlot.NONE,
        Effect.START_REENGAGE: lambda s: not s.reengaging and s.reengage and not s.closing,
        Effect.START_TRIM_CHECK: lambda s: not s.trim_checking,
    }
    for state, event, _, effects in transitions():
        for effect, allowed in starts.items():
            if effect in effects:
                assert allowed(state), (state, event, effect)


def test_a_change_or_a_new_term_blocks_appends() -> None:
    for state in STATES:
        busy = (
            state.change is not ChangeSlot.NONE or state.roll is not RollSlot.NONE
        ) or state.reengaging
        assert state.blocked == busy, state


def test_closed_and_failed_are_terminal() -> None:
    for state, event, new, effects in transitions():
        if state.stopped:
            assert effects == (), (state, event)
            assert new == dataclasses.replace(state, closing=new.closing), (state, event)
            assert new.phase is state.phase


def test_fail_writer_is_emitted_exactly_on_entering_a_terminal_state() -> None:
    for state, event, new, effects in transitions():
        entering = not state.stopped and new.stopped
        assert (Effect.FAIL_WRITER in effects) == entering, (state, event)
        if Effect.CLOSE_PIPELINE in effects:
            assert not new.stopped and new.reengaging, (state, event)


def test_a_closing_or_non_reengaging_writer_fails_when_fenced() -> None:
    for state in STATES:
        if state.stopped or state.reengaging:
            continue
        new, effects = step(state, Event.FENCED)
        if state.closing or not state.reengage:
            assert (new.end, effects) == (End.FAILED, (Effect.FAIL_WRITER,))
        else:
            assert effects == (Effect.CLOSE_PIPELINE, Effect.START_REENGAGE)


# ---------------------------------------------------------------- pending appends

MAX_APPENDS = 2


@dataclasses.dataclass(frozen=True)
class Appends:
    """A model of the writer's appends: queued, in the pipeline, and resolved (acknowledged,
    failed or refused); `resolutions` counts every resolution, to catch a second one."""

    queued: int = 0
    in_flight: int = 0
    resolved: int = 0
    resolutions: int = 0
    made: int = 0

    def apply(self, state: Lifecycle, effects: tuple[Effect, ...]) -> Appends:
        """Returns the appends after the writer carried out `effects` in `state` (the new one)."""
        appends = self
        for effect in effects:
            if effect is Effect.DRAIN and not state.blocked and not state.stopped:
                appends = dataclasses.replace(
                    appends, queued=0, in_flight=appends.in_flight + appends.queued
                )
            elif effect is Effect.CLOSE_PIPELINE:
                appends = appends.resolve(in_flight=appends.in_flight)
            elif effect is Effect.FAIL_WRITER:
                appends = appends.resolve(queued=appends.queued, in_flight=appends.in_flight)
        return appends

    def resolve(self, queued: int = 0, in_flight: int = 0) -> Appends:
        count = queued + in_flight
        return dataclasses.replace(
            self,
            queued=self.queued - queued,
            in_flight=self.in_flight - in_flight,
            resolved=self.resolved + count,
            resolutions=self.resolutions + count,
        )


def append(state: Lifecycle, appends: Appends) -> Appends:
    """An append: refused at once by a stopped writer, else queued (and drained when idle)."""
    made = dataclasses.replace(appends, made=appends.made + 1, queued=appends.queued + 1)
    if state.stopped:
        return made.resolve(queued=1)
    return made.apply(state, (Effect.DRAIN,))


def acknowledge(state: Lifecycle, appends: Appends) -> Appends:
    """The pipeline acknowledges what it holds (only a live pipeline answers)."""
    if state.stopped or state.reengaging or not appends.in_flight:
        return appends
    return appends.resolve(in_flight=appends.in_flight)


def test_every_pending_append_is_resolved_exactly_once_when_the_writer_stops() -> None:
    start = [(s, Appends()) for s in INITIAL]
    seen = set(start)
    todo = deque(start)
    while todo:
        state, appends = todo.popleft()
        assert appends.made == appends.queued + appends.in_flight + appends.resolved
        assert appends.resolutions == appends.resolved
        if state.stopped:
            assert appends.queued == appends.in_flight == 0, (state, appends)
        moves = [step(state, event) for event in Event]
        following = [(new, appends.apply(new, effects)) for new, effects in moves]
        if appends.made < MAX_APPENDS:
            following.append((state, append(state, appends)))
        following.append((state, acknowledge(state, appends)))
        for pair in following:
            if pair not in seen:
                seen.add(pair)
                todo.append(pair)
    assert len(seen) > len(STATES)


# ---------------------------------------------------------------- the oracle


@dataclasses.dataclass
class FlagWriter:
    """The lifecycle as `AsyncStreamWriter` held it before the machine: boolean flags read and
    written by its methods (each event below is one of those code paths)."""

    reengage: bool
    changing: bool = False
    rolling: bool = False
    roll_committing: bool = False
    reengaging: bool = False
    closing: bool = False
    trim_checking: bool = False
    error: bool = False

    def on(self, event: Event) -> tuple[Effect, ...]:
        if event is Event.BOOKIE_FAILED:  # on_bookie_failed
            if not self.changing and not self.error and not self.reengaging:
                self.changing = True
                return (Effect.START_ENSEMBLE_CHANGE,)
        elif event is Event.CHANGE_NEXT:  # a turn of change_ensemble's loop
            if self.changing and not self.error and not self.roll_committing:
                return (Effect.REPLACE_BOOKIE,)
        elif event is Event.CHANGE_ENDED:  # _run_job's finally
            if self.changing and not self.error:
                self.changing = False
                return (Effect.DRAIN,)
        elif event is Event.FRAGMENT_FULL:  # the drain or the age timer
            if not self.rolling and not self.error:
                self.rolling = True
                return (Effect.START_ROLL,)
        elif event is Event.ROLL_READY:  # roll leaving its wait
            if self.rolling and not self.roll_committing and not self.changing and not self.error:
                self.roll_committing = True
                return (Effect.COMMIT_ROLL,)
        elif event is Event.ROLL_ENDED:  # _run_job's finally
            if self.rolling and not self.error:
                self.rolling = self.roll_committing = False
                return (Effect.DRAIN,)
        elif event is Event.FENCED:  # _on_fenced
            if self.error or self.reengaging:
                return ()
            if not self.reengage or self.closing:
                self.error = True
                return (Effect.FAIL_WRITER,)
            self.reengaging = True
            return (Effect.CLOSE_PIPELINE, Effect.START_REENGAGE)
        elif event is Event.REENGAGE_ENDED:  # _reengage's finally
            if self.reengaging and not self.error:
                self.reengaging = False
                return (Effect.DRAIN,)
        elif event is Event.TRIMMED:  # on_trimmed
            if not self.error and not self.trim_checking:
                self.trim_checking = True
                return (Effect.START_TRIM_CHECK,)
        elif event is Event.CLOSE_REQUESTED:  # close()
            self.closing = True
        elif event in (Event.STOPPED, Event.FAILED) and not self.error:  # _fail
            self.error = True
            return (Effect.FAIL_WRITER,)
        return ()

    def blocked(self) -> bool:  # _blocked, without the pipeline's own checks
        return self.changing or self.rolling or self.reengaging


@pytest.mark.parametrize("reengage", [False, True])
def test_the_machine_decides_as_the_flags_did(reengage: bool) -> None:
    """Every event sequence (a walk of the pairs of states; the flags are deterministic too)
    gets the same effects from both. The flags' bookkeeping after a stop is left aside: the old
    code could still reset a flag there, which nothing read, and drained once more after a
    failed re-engagement, which only failed a queue `_fail` had emptied."""
    start = (Lifecycle(reengage=reengage), FlagWriter(reengage=reengage))
    seen = {(start[0], astuple(start[1]))}
    todo = deque([start])
    while todo:
        state, flags = todo.popleft()
        for event in Event:
            after = dataclasses.replace(flags)
            new, effects = step(state, event)
            assert effects == after.on(event), (state, flags, event)
            assert new.stopped == after.error, (state, flags, event)
            assert new.closing == after.closing, (state, flags, event)
            if not new.stopped:
                assert new.blocked == after.blocked(), (state, flags, event)
            key = (new, astuple(after))
            if key not in seen:
                seen.add(key)
                todo.append((new, after))
    assert len(seen) >= len([s for s in STATES if s.reengage == reengage])
