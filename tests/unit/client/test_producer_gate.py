"""The producer writer's gate: duplicates answer known ids, refusals change nothing, and the
sequence of each written entry is known for the roll's producer table update."""

from __future__ import annotations

import pytest

from stream.client.producer import ProducerGate
from stream.errors import InvalidArgumentError
from stream.protocol.producers import EPOCH_BITS, NO_SEQUENCE, UNKNOWN_ENTRY_ID, TailAnchor


def test_restart_answers_known_ids_then_writes() -> None:
    gate = ProducerGate("p1", 5, [TailAnchor(5, 41, 40)])
    assert [gate.admit(n) for n in range(7)] == [UNKNOWN_ENTRY_ID] * 4 + [40, 41, None]
    assert gate.last_sequence == 6


@pytest.mark.parametrize("bad", [None, "3", 2.0, True, -1, 9])
def test_refusals_change_nothing(bad: object) -> None:
    gate = ProducerGate("p1", 5)
    assert gate.admit(6) is None
    with pytest.raises(InvalidArgumentError):
        gate.admit(bad)
    assert gate.last_sequence == 6
    assert gate.admit(7) is None


def test_unknown_producer_starts_anywhere() -> None:
    gate = ProducerGate("p1", NO_SEQUENCE)
    assert gate.last_sequence == NO_SEQUENCE
    assert gate.admit(1000) is None
    with pytest.raises(InvalidArgumentError):
        gate.admit(1002)


def test_sequences_of_written_entries() -> None:
    gate = ProducerGate("p1", NO_SEQUENCE)
    epoch = 1 << EPOCH_BITS
    gate.assigned(10, [0, 1, 2])
    gate.assigned(13, [3, epoch, epoch + 1])
    gate.assigned(16, [2 * epoch])
    assert [gate.sequence_at(e) for e in range(9, 17)] == [
        NO_SEQUENCE,
        0,
        1,
        2,
        3,
        epoch,
        epoch + 1,
        2 * epoch,
    ]
    gate.forget_before(15)
    assert gate.sequence_at(15) == epoch + 1 and gate.sequence_at(16) == 2 * epoch
