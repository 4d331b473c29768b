"""Estimated payload bytes of a stream's entries, for `maxBytesPerTrigger`: a fragment closed
by a roll records its bytes in metadata, so its entries count at that fragment's average;
other entries (the open fragment, fragments whose count is partial) at a per-entry estimate."""

from __future__ import annotations

import bisect
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

# Entries whose payloads are sampled when no fragment of a stream records its bytes.
SAMPLE_ENTRIES = 64
# The estimate of a stream with neither fragment bytes nor entries to sample.
DEFAULT_ENTRY_BYTES = 1024.0


def whole_fragment_bytes(
    fragments: Sequence[tuple[int, int | None, int | None]], term_starts: Sequence[int]
) -> tuple[tuple[int, int, int], ...]:
    """Returns `(first, last, bytes)` of the `(first, last, bytes)` fragments whose recorded
    bytes count all their entries. A writer that takes a stream over goes on filling the
    fragment it found open, knowing the bytes only of what it wrote back and wrote itself: a
    fragment in which a term began (`term_starts`, the first entry ids of the terms the
    stream's metadata still lists) is left out, and so is one older than that list."""
    if not term_starts:
        return ()
    oldest = min(term_starts)
    return tuple(
        (first, last, size)
        for first, last, size in fragments
        if last is not None
        and size is not None
        and first >= oldest
        and not any(first < start <= last for start in term_starts)
    )


@dataclass(frozen=True)
class EntrySizes:
    """Bytes per entry over a stream's entry ids: `known` holds `(first, last, bytes)` of the
    fragments whose bytes are recorded (sorted, disjoint); other entries weigh `estimate`."""

    known: tuple[tuple[int, int, int], ...]
    estimate: float

    @classmethod
    def of(cls, known: Sequence[tuple[int, int, int]], sampled: float | None) -> EntrySizes:
        """Returns the sizes with `known` fragments; the estimate elsewhere is their average
        per entry, else `sampled`, else DEFAULT_ENTRY_BYTES."""
        entries = sum(last - first + 1 for first, last, _ in known)
        if entries:
            estimate = sum(size for _, _, size in known) / entries
        else:
            estimate = DEFAULT_ENTRY_BYTES if sampled is None else sampled
        return cls(tuple(sorted(known)), estimate)

    def entries_within(self, first: int, most: int, budget: float) -> tuple[int, float]:
        """Returns how many entries from `first` on (at most `most`) fit in `budget` bytes,
        and their bytes."""
        count, used = 0, 0.0
        starts = [f for f, _, _ in self.known]
        position = first
        while count < most:
            rate, end = self._run_at(position, starts)
            available = min(end - position + 1, most - count)
            # An entry of no bytes still costs a row: at least one byte each.
            per_entry = max(rate, 1.0)
            fits = min(available, math.floor((budget - used) / per_entry + 1e-9))
            count += fits
            used += fits * per_entry
            position += fits
            if fits < available:
                break
        return count, used

    def _run_at(self, position: int, starts: list[int]) -> tuple[float, int]:
        """Returns the bytes per entry at `position` and the last entry id at that rate."""
        i = bisect.bisect_right(starts, position) - 1
        if i >= 0:
            first, last, size = self.known[i]
            if position <= last:
                return size / (last - first + 1), last
        following = starts[i + 1] - 1 if i + 1 < len(starts) else sys.maxsize
        return self.estimate, following
