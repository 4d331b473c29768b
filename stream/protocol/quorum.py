"""Quorum configuration (E, WQ, AQ) and the round-robin striping of entries over an ensemble."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from stream.errors import InvalidArgumentError
from stream.protocol.coverage import is_covered

T = TypeVar("T")

# Bounds the cost of every per-ensemble loop and of the coverage tables; real ensembles are <= 10.
MAX_ENSEMBLE_SIZE = 64


@dataclass(frozen=True, slots=True)
class QuorumConfig:
    """A stream's ensemble size E, write quorum WQ and ack quorum AQ, `E >= WQ >= AQ >= 1`.

    Raises `InvalidArgumentError` at construction when the values are not ints or break the
    ordering, or when E exceeds `MAX_ENSEMBLE_SIZE`.
    """

    ensemble: int
    write_quorum: int
    ack_quorum: int
    # The E distinct write sets, indexed by entry_id % E: write_set() is on every add's path.
    _write_sets: tuple[tuple[int, ...], ...] = field(
        init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        e, wq, aq = self.ensemble, self.write_quorum, self.ack_quorum
        context = {"ensemble": e, "write_quorum": wq, "ack_quorum": aq}
        if not all(type(v) is int for v in (e, wq, aq)):
            raise InvalidArgumentError("ensemble, write_quorum, ack_quorum must be ints", **context)
        if not e >= wq >= aq >= 1:
            raise InvalidArgumentError(
                "quorums must satisfy ensemble >= write_quorum >= ack_quorum >= 1", **context
            )
        if e > MAX_ENSEMBLE_SIZE:
            raise InvalidArgumentError(f"ensemble must be at most {MAX_ENSEMBLE_SIZE}", **context)
        write_sets = tuple(tuple((r + i) % e for i in range(wq)) for r in range(e))
        object.__setattr__(self, "_write_sets", write_sets)

    @property
    def quorum_coverage(self) -> int:
        """Return QC = WQ - AQ + 1: answers from an entry's write set that cover it."""
        return self.write_quorum - self.ack_quorum + 1

    @property
    def ensemble_coverage(self) -> int:
        """Return EC = E - AQ + 1: answers from the ensemble that cover it."""
        return self.ensemble - self.ack_quorum + 1

    def write_set(self, entry_id: int) -> tuple[int, ...]:
        """Return the ensemble indices that store `entry_id`: `(entry_id + i) % E` for i < WQ."""
        if entry_id < 0:
            raise InvalidArgumentError("entry_id must be >= 0", entry_id=entry_id)
        return self._write_sets[entry_id % self.ensemble]

    def write_set_bookies(self, ensemble: Sequence[T], entry_id: int) -> tuple[T, ...]:
        """Return the members of `ensemble` (E bookies) that store `entry_id`, in write-set
        order."""
        if len(ensemble) != self.ensemble:
            raise InvalidArgumentError(
                "ensemble has the wrong size",
                expected=self.ensemble,
                actual=len(ensemble),
            )
        return tuple(ensemble[i] for i in self.write_set(entry_id))

    def stores_entry(self, bookie_index: int, entry_id: int) -> bool:
        """Return whether ensemble index `bookie_index` is in the write set of `entry_id`."""
        self._check_index(bookie_index)
        if entry_id < 0:
            raise InvalidArgumentError("entry_id must be >= 0", entry_id=entry_id)
        return (bookie_index - entry_id) % self.ensemble < self.write_quorum

    def bookie_index_entries(
        self, bookie_index: int, first_entry_id: int, last_entry_id: int
    ) -> Iterator[int]:
        """Yield, in increasing order, the ids in `[first_entry_id, last_entry_id]` that
        ensemble index `bookie_index` stores (what a repair must copy to that index)."""
        self._check_index(bookie_index)
        if first_entry_id < 0:
            raise InvalidArgumentError("first_entry_id must be >= 0", entry_id=first_entry_id)
        e = self.ensemble
        # Entry x is stored by i iff x % E is one of these residues; walk E-sized blocks.
        residues = sorted((bookie_index - d) % e for d in range(self.write_quorum))
        base = first_entry_id - first_entry_id % e
        while base <= last_entry_id:
            for r in residues:
                entry_id = base + r
                if first_entry_id <= entry_id <= last_entry_id:
                    yield entry_id
            base += e

    def quorum_covered(self, entry_id: int, satisfied: Collection[int]) -> bool:
        """Return whether the ensemble indices in `satisfied` cover the write set of
        `entry_id` (QC): no AQ-subset of the write set lies wholly outside `satisfied`."""
        count = sum(1 for i in self.write_set(entry_id) if i in satisfied)
        return is_covered(self.write_quorum, self.ack_quorum, count)

    def ensemble_covered(self, satisfied: Collection[int]) -> bool:
        """Return whether the ensemble indices in `satisfied` cover the ensemble (EC)."""
        count = sum(1 for i in range(self.ensemble) if i in satisfied)
        return is_covered(self.ensemble, self.ack_quorum, count)

    def _check_index(self, bookie_index: int) -> None:
        if not 0 <= bookie_index < self.ensemble:
            raise InvalidArgumentError(
                "bookie_index must lie in [0, ensemble)",
                bookie_index=bookie_index,
                ensemble=self.ensemble,
            )
