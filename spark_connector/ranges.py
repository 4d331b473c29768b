"""Pure planning: offsets (next entry id per stream, JSON with keys in sorted order, since
Spark compares offsets as JSON strings), read limits spread over streams, and the split of an
offset range into partitions by fragment and size."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from stream.errors import InvalidArgumentError

Offsets = dict[str, int]


def ordered(offsets: Mapping[str, int]) -> Offsets:
    """Returns `offsets` with its keys sorted: the same offsets always give the same JSON."""
    return {name: int(offsets[name]) for name in sorted(offsets)}


@dataclass(frozen=True)
class StreamRange(InputPartition):
    """One Spark task's work: entries `first..last` (inclusive) of `stream`, everything the
    executor needs included (`read()` runs on a pickled copy far from the driver)."""

    metadata: str
    stream: str
    first: int
    last: int
    fail_on_data_loss: bool
    include_headers: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.first <= self.last:
            raise InvalidArgumentError(
                "a stream range needs 0 <= first <= last",
                stream=self.stream, first=self.first, last=self.last,
            )


def split_range(
    first: int, last: int, fragment_firsts: Sequence[int], entries_per_partition: int
) -> list[tuple[int, int]]:
    """Returns `first..last` cut at every fragment start and every `entries_per_partition`
    entries, as inclusive `(first, last)` pieces in order."""
    if first > last:
        return []
    cuts = sorted({f for f in fragment_firsts if first < f <= last})
    pieces: list[tuple[int, int]] = []
    start = first
    for end_exclusive in [*cuts, last + 1]:
        while start < end_exclusive:
            stop = min(end_exclusive, start + entries_per_partition)
            pieces.append((start, stop - 1))
            start = stop
    return pieces


def limit_offsets(start: Mapping[str, int], latest: Mapping[str, int], max_entries: int) -> Offsets:
    """Returns end offsets between `start` and `latest` covering at most `max_entries` entry
    ids in all, shared fairly: each stream gets an equal share, what a stream cannot use goes
    to the others (water filling, streams in name order)."""
    wanted = {name: max(0, latest[name] - start.get(name, latest[name])) for name in latest}
    granted = dict.fromkeys(wanted, 0)
    budget = max_entries
    hungry = sorted(name for name, n in wanted.items() if n > 0)
    while budget > 0 and hungry:
        share = max(1, budget // len(hungry))
        for name in list(hungry):
            take = min(share, wanted[name] - granted[name], budget)
            granted[name] += take
            budget -= take
            if granted[name] == wanted[name]:
                hungry.remove(name)
            if budget == 0:
                break
    return ordered(
        {name: start.get(name, latest[name]) + granted[name] for name in latest}
    )
