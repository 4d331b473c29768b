"""Finding the first entry at or after a time (`seek_time`): pure search logic, no I/O.

Entry timestamps never go backwards within a stream (docs/design.md, "Time"), so "the first
data entry at or after `i` is stamped at or after T" holds from some id on: a binary search over
entry ids finds it. The fragments' recorded first and last timestamps narrow the search to one
fragment before any entry is read; the entries are then read one at a time (`probe`).

No-op entries carry no data: a probe that lands on one reads on to the next data entry, and
the answer is always a data entry's id (or `end`, the id after the last entry, when every data
entry is earlier).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from stream.metadata.model import Fragment

# `probe(entry_id)` returns the first data entry at or after `entry_id` and below the search's
# end as (its id, its timestamp), or None when there is none.
Probe = Callable[[int], Awaitable[tuple[int, int] | None]]


def search_range(
    fragments: Sequence[Fragment], first_retained: int, end: int, ts_ms: int
) -> tuple[int, int]:
    """Returns `(lo, hi)`, with `first_retained <= lo <= hi <= end`, from the fragments'
    recorded timestamps (sorted fragments; `end`: the id after the last entry): every data
    entry below `lo` is stamped before `ts_ms`, and the first data entry at or after `hi`, if
    any, at or after it. A fragment without recorded timestamps (the open one; one cut short
    by an ensemble change) narrows nothing: the range then spans it."""
    lo, hi = first_retained, end
    for index, fragment in enumerate(fragments):
        if fragment.first_timestamp_ms is not None and fragment.first_timestamp_ms >= ts_ms:
            hi = min(hi, fragment.first_entry_id)
            break
        last = fragment.last_entry_id
        if last is None and index + 1 < len(fragments):
            last = fragments[index + 1].first_entry_id - 1
        stamped = fragment.last_timestamp_ms
        if last is not None and stamped is not None and stamped < ts_ms:
            lo = max(lo, last + 1)
    lo = min(lo, end)
    return lo, max(lo, min(hi, end))


async def first_at_or_after(lo: int, hi: int, end: int, ts_ms: int, probe: Probe) -> int:
    """Returns the id of the first data entry stamped at or after `ts_ms`, `end` when there is
    none, given `search_range`'s `lo` and `hi`; about log2(hi - lo) + 1 probes."""
    # What the first data entry at or after `hi` is, once a probe told (None: not known yet).
    answer: int | None = end if hi >= end else None
    while lo < hi:
        mid = (lo + hi) // 2
        found = await probe(mid)
        if found is None:
            hi, answer = mid, end
            continue
        entry_id, timestamp_ms = found
        if timestamp_ms >= ts_ms:
            hi, answer = mid, entry_id
        else:
            # Every data entry up to `entry_id` is earlier. (Past `hi` only when the recorded
            # timestamps disagree with the entries: then `hi` is settled by a probe below.)
            if entry_id >= hi:
                answer = None
            lo = min(entry_id + 1, hi)
    if answer is None:
        found = await probe(hi)
        answer = end if found is None else found[0]
    return answer
