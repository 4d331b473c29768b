"""A range read's records, located: the index locations of consecutive entries (`<IQI`, log
id, offset of the entry's bytes, length: `codec.LOCATION`) taken up to an answer's byte budget
and cut into runs of adjacent records, each read with one pread and framed as one span.
`index_runs` is compiled (`stream.framing.native`); `index_runs_python` is the definition it is
held to (tests/unit/bookie/test_locations.py) and the fallback where it is not built."""

from __future__ import annotations

import struct
from bisect import bisect_left
from functools import lru_cache
from itertools import accumulate, repeat
from operator import add, eq, sub

from stream.bookie.storage import codec
from stream.framing import native

# A run of adjacent records: (log id, offset of its first record, the records' offsets, their
# lengths).
Run = tuple[int, int, tuple[int, ...], tuple[int, ...]]


@lru_cache(maxsize=64)
def _locations_struct(n: int) -> struct.Struct:
    return struct.Struct("<" + codec.LOCATION.format.lstrip("<") * n)


def index_runs_python(located: list[bytes], budget: int, header: int) -> tuple[int, list[Run]]:
    """Returns (count, runs): the first `count` of `located` are taken, up to and with the one
    whose length brings their sum to `budget` (at least one, unless `located` is empty), and
    `runs` cuts those into runs of adjacent records: one log, each record's offset `header`
    bytes past the end of the one before. A location that is not `codec.LOCATION_BYTES` long
    raises ValueError. No Python step per entry where the records are one run (the usual
    case)."""
    if header < 0:
        raise ValueError("header must not be negative")
    if located and set(map(len, located)) != {codec.LOCATION_BYTES}:
        raise ValueError(f"a location is not {codec.LOCATION_BYTES} bytes")
    flat = _locations_struct(len(located)).unpack(b"".join(located))
    lengths = flat[2::3]
    count = min(bisect_left(list(accumulate(lengths)), budget) + 1, len(located))
    if not count:
        return 0, []
    logs, offsets, lengths = flat[0 : 3 * count : 3], flat[1 : 3 * count : 3], lengths[:count]
    ends = list(map(add, offsets, lengths))
    if logs.count(logs[0]) == count and all(map(eq, map(sub, offsets[1:], ends), repeat(header))):
        return count, [(logs[0], offsets[0], offsets, lengths)]
    runs: list[Run] = []
    i = 0
    while i < count:
        j = i + 1
        while j < count and logs[j] == logs[i] and offsets[j] == ends[j - 1] + header:
            j += 1
        runs.append((logs[i], offsets[i], offsets[i:j], lengths[i:j]))
        i = j
    return count, runs


# The compiled step where the module is built.
index_runs = native.index_runs if native.BUILT else index_runs_python
