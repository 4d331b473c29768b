"""Idempotent producers (docs/design.md §12 "Idempotent producers"), as pure decisions: what a
producer's last durable sequence is, given the stream's producer table and the recovered tail;
whether an append's sequence is new, a duplicate, a gap or a step back; how the producer table
is folded and bounded when a fragment closes.

A sequence is a 64-bit number split in an **epoch** (the high `EPOCH_BITS` bits) and a
**position** (the low ones). Sequences go up by one, and may jump to the first sequence
(position 0) of a higher epoch: a producer that counts 0, 1, 2... never leaves epoch 0, and
the Spark sink numbers rows `batchId << EPOCH_BITS | row index`, each batch an epoch.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

EPOCH_BITS = 32
# The wire stores `sequence + 1` in an int64 (0 there means "none").
MAX_SEQUENCE = (1 << 63) - 2
# A producer that never wrote (or whose record expired): any first sequence starts it.
NO_SEQUENCE = -1
# The entry id a duplicate answers when its id is no longer known (older than the recovered
# tail and not the table's last): the append was written before, where is not kept (Kafka
# answers offset -1 the same way past its five cached batches).
UNKNOWN_ENTRY_ID = -1
# Producer records a stream keeps in its metadata; the least recently used go first past it.
MAX_PRODUCERS = 256
DEFAULT_PRODUCER_EXPIRY_MS = 7 * 86_400_000  # Kafka's transactional.id.expiration.ms
MAX_PRODUCER_ID_CHARS = 255


class SequenceDecision(enum.Enum):
    """What a producer writer does with an append numbered `n`."""

    WRITE = "write"  # new: written with this sequence
    DUPLICATE = "duplicate"  # durably written before: nothing is written, the old id answers
    GAP = "gap"  # skips sequences: refused
    STEP_BACK = "step_back"  # at or below one already appended in this session: refused
    OUT_OF_RANGE = "out_of_range"  # not in [0, MAX_SEQUENCE]: refused

    @property
    def refused(self) -> bool:
        """Returns whether the append is refused (`InvalidArgumentError`, nothing written)."""
        return self not in (SequenceDecision.WRITE, SequenceDecision.DUPLICATE)


@dataclass(frozen=True)
class ProducerPosition:
    """One producer's record in the stream's producer table: the highest sequence it durably
    wrote in a closed part of the stream, that entry's id, and when it last wrote (ms)."""

    producer_id: str
    last_sequence: int
    last_entry_id: int
    last_used_ms: int


def epoch_of(sequence: int) -> int:
    """Returns the epoch (high bits) of `sequence`."""
    return sequence >> EPOCH_BITS


def starts_higher_epoch(sequence: int, last: int) -> bool:
    """Returns whether `sequence` is position 0 of an epoch above `last`'s."""
    position_mask = (1 << EPOCH_BITS) - 1
    return sequence & position_mask == 0 and epoch_of(sequence) > epoch_of(last)


def follows(sequence: int, last: int) -> bool:
    """Returns whether `sequence` may come right after `last`: one more, or a new epoch."""
    return sequence == last + 1 or starts_higher_epoch(sequence, last)


def decide_sequence(
    sequence: int, recovered_last: int, session_last: int | None
) -> SequenceDecision:
    """Returns what to do with an append numbered `sequence` by a writer that recovered
    `recovered_last` for its producer (`NO_SEQUENCE`: unknown producer) and accepted
    `session_last` last since it opened (None: nothing yet).

    The first append may restart anywhere up to `recovered_last + 1` (a producer re-running
    from its start, or from its last checkpoint); later ones must follow the previous one.
    Sequences at or below `recovered_last` are duplicates; an unknown producer starts at any
    sequence."""
    if not 0 <= sequence <= MAX_SEQUENCE:
        return SequenceDecision.OUT_OF_RANGE
    if session_last is None:
        if recovered_last == NO_SEQUENCE:
            return SequenceDecision.WRITE
        if sequence <= recovered_last:
            return SequenceDecision.DUPLICATE
        return SequenceDecision.WRITE if follows(sequence, recovered_last) else SequenceDecision.GAP
    if sequence <= session_last:
        return SequenceDecision.STEP_BACK
    if not follows(sequence, session_last):
        return SequenceDecision.GAP
    return SequenceDecision.DUPLICATE if sequence <= recovered_last else SequenceDecision.WRITE


@dataclass(frozen=True)
class TailAnchor:
    """A producer's last entry in a run of its entries read back (or recorded): sequence
    `sequence` at `entry_id`, the run starting at `first_entry_id`. Within one term a
    producer's entries are contiguous and, within one epoch, their sequences go up by one, so
    the anchor also tells the ids of the run's earlier sequences of its epoch."""

    sequence: int
    entry_id: int
    first_entry_id: int


def recovered_position(
    producer_id: str, recorded: ProducerPosition | None, tail: TailAnchor | None
) -> tuple[int, tuple[TailAnchor, ...]]:
    """Returns a producer's last durable sequence (`NO_SEQUENCE`: unknown) and the anchors
    that tell the ids of its duplicates: `recorded` is its record in the producer table
    (closed fragments), `tail` its last entry in the tail the takeover read (None when that
    tail was another producer's, or empty)."""
    anchors: list[TailAnchor] = []
    last = NO_SEQUENCE
    if recorded is not None and recorded.producer_id == producer_id:
        last = recorded.last_sequence
        anchors.append(
            TailAnchor(recorded.last_sequence, recorded.last_entry_id, recorded.last_entry_id)
        )
    if tail is not None:
        last = max(last, tail.sequence)
        anchors.append(tail)
    return last, tuple(anchors)


def duplicate_entry_id(sequence: int, anchors: Iterable[TailAnchor]) -> int:
    """Returns the id a duplicate append numbered `sequence` answers: the entry written with
    it when an anchor's run holds it, else `UNKNOWN_ENTRY_ID`."""
    for anchor in anchors:
        back = anchor.sequence - sequence
        if (
            back >= 0
            and epoch_of(sequence) == epoch_of(anchor.sequence)
            and anchor.entry_id - back >= anchor.first_entry_id
        ):
            return anchor.entry_id - back
    return UNKNOWN_ENTRY_ID


def fold_producers(
    table: Iterable[ProducerPosition],
    updates: Iterable[ProducerPosition],
    now_ms: int,
    expiry_ms: int = DEFAULT_PRODUCER_EXPIRY_MS,
    max_producers: int = MAX_PRODUCERS,
) -> tuple[ProducerPosition, ...]:
    """Returns the producer table with `updates` merged in (a producer's record moves to the
    higher sequence; the same sequence keeps the later use), without the producers unused for
    more than `expiry_ms` before `now_ms`, and at most `max_producers` records (the most
    recently used), sorted by producer id so that equal tables give equal metadata bytes."""
    merged: dict[str, ProducerPosition] = {p.producer_id: p for p in table}
    for update in updates:
        old = merged.get(update.producer_id)
        if old is None or (update.last_sequence, update.last_used_ms) > (
            old.last_sequence,
            old.last_used_ms,
        ):
            merged[update.producer_id] = update
    live = [p for p in merged.values() if now_ms - p.last_used_ms <= expiry_ms]
    live.sort(key=lambda p: (-p.last_used_ms, p.producer_id))
    return tuple(sorted(live[:max_producers], key=lambda p: p.producer_id))


def find_producer(table: Iterable[ProducerPosition], producer_id: str) -> ProducerPosition | None:
    """Returns `producer_id`'s record in `table`, None when it has none (never wrote, or
    expired)."""
    for position in table:
        if position.producer_id == producer_id:
            return position
    return None
