"""Pure planning: offsets (next entry id per stream, JSON with keys in sorted order, since
Spark compares offsets as JSON strings), read limits spread over streams, and the split of an
offset range into partitions by fragment, size and a minimum count."""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pyspark.sql.datasource import InputPartition

from spark_connector.entry_sizes import EntrySizes
from stream.errors import InvalidArgumentError
from stream.security.tls import TLSConfig

Offsets = dict[str, int]


def ordered(offsets: Mapping[str, int]) -> Offsets:
    """Returns `offsets` with its keys sorted: the same offsets always give the same JSON."""
    return {name: int(offsets[name]) for name in sorted(offsets)}


@dataclass(frozen=True)
class StreamRange(InputPartition):
    """One Spark task's work: entries `first..last` (inclusive) of `stream`, everything the
    executor needs included (`read()` runs on a pickled copy far from the driver).
    `stream_id`: the id of the stream the driver planned it on (None: not known), so that a
    stream deleted and created again under its name meanwhile is not read in its place."""

    metadata: str
    stream: str
    first: int
    last: int
    fail_on_data_loss: bool
    tls: TLSConfig | None = None
    metadata_auth_file: str | None = None
    include_headers: bool = False
    stream_id: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.first <= self.last:
            raise InvalidArgumentError(
                "a stream range needs 0 <= first <= last",
                stream=self.stream,
                first=self.first,
                last=self.last,
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


Key = TypeVar("Key")


def at_least(pieces: Sequence[tuple[Key, int, int]], count: int) -> list[tuple[Key, int, int]]:
    """Returns `pieces` (inclusive `(key, first, last)` ranges) cut further, each into
    near-equal parts, until there are at least `count` (or every part is one entry), in the
    same order. Each further cut goes to the piece whose parts are largest then, so the
    largest part comes out as small as it can."""
    sizes = [last - first + 1 for _, first, last in pieces]
    parts = [1] * len(pieces)
    # Keys start as sizes and become (float) part sizes: a max-heap through negation.
    largest: list[tuple[float, int]] = [(-size, i) for i, size in enumerate(sizes) if size > 1]
    heapq.heapify(largest)
    for _ in range(count - len(pieces)):
        if not largest:
            break
        _, i = heapq.heappop(largest)
        parts[i] += 1
        if parts[i] < sizes[i]:
            heapq.heappush(largest, (-sizes[i] / parts[i], i))
    out: list[tuple[Key, int, int]] = []
    for (key, first, _), size, k in zip(pieces, sizes, parts, strict=True):
        # k parts of size // k entries, the first size % k of them one entry more.
        start = first
        for j in range(k):
            stop = start + size // k + (1 if j < size % k else 0)
            out.append((key, start, stop - 1))
            start = stop
    return out


def limit_offsets(
    start: Mapping[str, int],
    latest: Mapping[str, int],
    max_entries: int | None,
    max_bytes: int | None = None,
    sizes: Mapping[str, EntrySizes] | None = None,
) -> Offsets:
    """Returns end offsets between `start` and `latest` covering at most `max_entries` entry
    ids and `max_bytes` bytes (as `sizes` estimates each stream's entries) in all; None is no
    bound of that kind. Both are shared fairly: each stream gets an equal share, what a stream
    cannot use goes to the others (water filling, streams in name order). When not even one
    entry fits `max_bytes`, the offsets still cover one entry (of the first stream with any):
    an entry larger than the bound is read alone, not never."""
    firsts = {name: start.get(name, latest[name]) for name in latest}
    wanted = {name: max(0, latest[name] - firsts[name]) for name in latest}
    granted = dict.fromkeys(wanted, 0)
    hungry = sorted(name for name, n in wanted.items() if n > 0)
    entries_left = sum(wanted.values()) if max_entries is None else max_entries
    bytes_left = math.inf if max_bytes is None else float(max_bytes)

    def take(name: str, most: int, budget: float) -> int:
        nonlocal entries_left, bytes_left
        most = min(most, wanted[name] - granted[name], entries_left)
        count, used = most, 0.0
        if max_bytes is not None:
            assert sizes is not None, "a byte bound needs the streams' entry sizes"
            count, used = sizes[name].entries_within(firsts[name] + granted[name], most, budget)
        granted[name] += count
        entries_left -= count
        bytes_left -= used
        if granted[name] == wanted[name]:
            hungry.remove(name)
        return count

    while entries_left > 0 and hungry:
        share = max(1, entries_left // len(hungry))
        byte_share = bytes_left / len(hungry)
        taken = 0
        for name in list(hungry):
            taken += take(name, share, byte_share)
            if entries_left == 0:
                break
        if taken == 0:
            # No stream's next entry fits its share of the bytes: each in turn may use all.
            for name in list(hungry):
                take(name, entries_left, bytes_left)
            break
    if hungry and not any(granted.values()):
        granted[hungry[0]] = 1
    return ordered({name: firsts[name] + granted[name] for name in latest})
