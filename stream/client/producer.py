"""An idempotent producer's writer-side state (docs/design.md §11): the position its takeover
recovered, the sequences accepted since, and which sequence each written entry carries (for
the producer table a roll updates). The rules themselves are `stream.protocol.producers`."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from stream.client.recovery import TakeoverResult
from stream.errors import InvalidArgumentError
from stream.protocol.producers import (
    MAX_SEQUENCE,
    NO_SEQUENCE,
    SequenceDecision,
    TailAnchor,
    decide_sequence,
    duplicate_entry_id,
    find_producer,
    recovered_position,
)

_REFUSALS = {
    SequenceDecision.GAP: "sequence skips ahead: sequences go up by one (or start a new epoch)",
    SequenceDecision.STEP_BACK: "sequence at or below one this writer already appended",
    SequenceDecision.OUT_OF_RANGE: f"sequence must be an int in [0, {MAX_SEQUENCE}]",
}


class ProducerGate:
    """Decides each append of one producer writer: written, or a duplicate answered with the id
    already written; refuses gaps and steps back. Appends of one producer come from one
    thread at a time (their order is their meaning)."""

    def __init__(
        self, producer_id: str, last_sequence: int, anchors: Iterable[TailAnchor] = ()
    ) -> None:
        self.producer_id = producer_id
        self.recovered_last = last_sequence
        self._anchors = tuple(anchors)
        self._session_last: int | None = None
        # Entries written in this term, as runs: (first entry id, its sequence), each entry
        # after a run's first carrying one more than the one before it.
        self._run_ids: list[int] = []
        self._run_sequences: list[int] = []

    @property
    def last_sequence(self) -> int:
        """Returns the highest sequence recovered or accepted since (-1: none)."""
        if self._session_last is None:
            return self.recovered_last
        return max(self.recovered_last, self._session_last)

    def admit(self, sequence: object) -> int | None:
        """Returns None when the append numbered `sequence` is to be written, or the entry id
        a duplicate answers; raises `InvalidArgumentError` (and changes nothing) for a gap, a
        step back or a sequence that is not an int in range."""
        last = self._session_last
        if (
            type(sequence) is int
            and last is not None
            and sequence == last + 1
            and last >= self.recovered_last
            and sequence <= MAX_SEQUENCE
        ):
            self._session_last = sequence  # the common case: the next one, past the recovered
            return None
        if isinstance(sequence, bool) or not isinstance(sequence, int):
            raise InvalidArgumentError(
                "a producer writer's appends need a sequence (an int)",
                producer_id=self.producer_id,
                sequence=repr(sequence),
            )
        decision = decide_sequence(sequence, self.recovered_last, self._session_last)
        if decision.refused:
            raise InvalidArgumentError(
                _REFUSALS[decision],
                producer_id=self.producer_id,
                sequence=sequence,
                last_sequence=self.last_sequence,
            )
        self._session_last = sequence
        if decision is SequenceDecision.DUPLICATE:
            return duplicate_entry_id(sequence, self._anchors)
        return None

    def assigned(self, first_entry_id: int, sequences: Sequence[int]) -> None:
        """Records that entries from `first_entry_id` on carry `sequences` (a drained run)."""
        expected = None
        if self._run_ids:
            expected = self.sequence_at(first_entry_id - 1)
        for offset, sequence in enumerate(sequences):
            if expected is None or sequence != expected + 1:
                self._run_ids.append(first_entry_id + offset)
                self._run_sequences.append(sequence)
            expected = sequence

    def sequence_at(self, entry_id: int) -> int:
        """Returns the sequence of entry `entry_id` written in this term (NO_SEQUENCE when it
        lies before the first)."""
        index = bisect.bisect_right(self._run_ids, entry_id) - 1
        if index < 0:
            return NO_SEQUENCE
        return self._run_sequences[index] + entry_id - self._run_ids[index]

    def forget_before(self, entry_id: int) -> None:
        """Drops the runs wholly before `entry_id` (a roll closed them into the table)."""
        index = bisect.bisect_right(self._run_ids, entry_id) - 1
        if index > 0:
            del self._run_ids[:index], self._run_sequences[:index]


def producer_gate(producer_id: str, result: TakeoverResult) -> ProducerGate:
    """Returns the gate of `producer_id`'s writer after the takeover `result`: its position
    from the producer table (which the takeover folded the previous term into) and, when that
    term was its own, the tail's anchor (which tells the ids of that run's duplicates)."""
    tail = result.producer_tail if result.producer_tail_of == producer_id else None
    recorded = find_producer(result.meta.producers, producer_id)
    last, anchors = recovered_position(producer_id, recorded, tail)
    return ProducerGate(producer_id, last, anchors)
