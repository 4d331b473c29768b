"""The search behind `seek_time` (stream/client/timeseek.py), over in-memory streams: the same
answer as a scan for any time, no-ops never answered, fragment timestamps used when recorded and
not trusted when missing, and a logarithmic number of probes."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from stream.client.timeseek import first_at_or_after, search_range
from stream.metadata.model import Fragment

ENSEMBLE = ("b1", "b2", "b3")


@dataclass
class Stream:
    """Entries `first..end-1`: each a timestamp, no-ops marked; fragments over them."""

    first: int
    stamps: list[int]
    noops: set[int]
    fragments: list[Fragment]

    @property
    def end(self) -> int:
        return self.first + len(self.stamps)

    def stamp(self, entry_id: int) -> int:
        return self.stamps[entry_id - self.first]

    def scan(self, ts_ms: int) -> int:
        """The first data entry stamped at or after `ts_ms`, entry by entry; `end` if none."""
        for entry_id in range(self.first, self.end):
            if entry_id not in self.noops and self.stamp(entry_id) >= ts_ms:
                return entry_id
        return self.end

    def seek(self, ts_ms: int) -> tuple[int, int, int]:
        """Returns (answer, probes, entries read) of the metadata range plus the search."""
        lo, hi = search_range(self.fragments, self.first, self.end, ts_ms)
        counts = [0, 0]

        async def probe(entry_id: int) -> tuple[int, int] | None:
            counts[0] += 1
            for position in range(entry_id, self.end):
                counts[1] += 1
                if position not in self.noops:
                    return position, self.stamp(position)
            return None

        answer = asyncio.run(first_at_or_after(lo, hi, self.end, ts_ms, probe))
        return answer, counts[0], counts[1]


def build(
    first: int,
    stamps: list[int],
    noops: set[int],
    lengths: list[int],
    recorded: list[bool],
) -> Stream:
    """A stream whose fragments have `lengths` entries (the last one open), closed ones with
    their timestamps recorded where `recorded` says (the data entries' first and last, as the
    writer records them: monotone, so no data entry is earlier than the first)."""
    fragments = []
    start = first
    for index, length in enumerate(lengths):
        last = index == len(lengths) - 1
        end = start + length - 1
        data = [stamps[i - first] for i in range(start, end + 1) if i not in noops]
        record = not last and recorded[index] and bool(data)
        fragments.append(
            Fragment(
                start,
                ENSEMBLE,
                last_entry_id=None if last else end,
                first_timestamp_ms=min(data) if record else None,
                last_timestamp_ms=max(data) if record else None,
            )
        )
        start = end + 1
    return Stream(first, stamps, noops, fragments)


@st.composite
def streams(draw: st.DrawFn) -> Stream:
    first = draw(st.integers(0, 1000))
    steps = draw(st.lists(st.integers(0, 3), min_size=0, max_size=300))
    base = draw(st.integers(0, 10**12))
    stamps = [base + s for s in itertools.accumulate(steps)]
    ids = range(first, first + len(stamps))
    noops = {i for i in ids if draw(st.integers(0, 9)) == 0}
    for noop in noops:
        # A no-op is stamped like any entry; an old one may carry any time: never used.
        if draw(st.booleans()):
            stamps[noop - first] = draw(st.integers(0, 2 * 10**12))
    lengths: list[int] = []
    remaining = len(stamps)
    while remaining > 0:
        length = draw(st.integers(1, max(1, remaining)))
        lengths.append(length)
        remaining -= length
    recorded = [draw(st.booleans()) for _ in lengths]
    return build(first, stamps, noops, lengths or [0], recorded or [False])


@settings(max_examples=120, deadline=None)
@given(stream=streams(), data=st.data())
def test_seek_agrees_with_a_scan(stream: Stream, data: st.DataObject) -> None:
    ids = range(stream.first, stream.end)
    data_stamps = [stream.stamp(i) for i in ids if i not in stream.noops]
    candidates = st.integers(0, 2 * 10**12)
    if data_stamps:
        candidates = st.one_of(
            candidates,
            st.sampled_from(data_stamps).map(lambda t: t - 1),
            st.sampled_from(data_stamps),
            st.sampled_from(data_stamps).map(lambda t: t + 1),
        )
    for ts_ms in data.draw(st.lists(candidates, min_size=1, max_size=10)):
        answer, _, _ = stream.seek(ts_ms)
        assert answer == stream.scan(ts_ms)
        assert answer not in stream.noops


def _plain(count: int, fragment_entries: int, recorded: bool = True) -> Stream:
    """`count` data entries stamped 1000, 1002, 1004... in fragments of `fragment_entries`."""
    lengths = [fragment_entries] * (count // fragment_entries)
    if count % fragment_entries:
        lengths.append(count % fragment_entries)
    stamps = [1000 + 2 * i for i in range(count)]
    return build(0, stamps, set(), lengths, [recorded] * len(lengths))


def test_recorded_timestamps_narrow_the_search_to_one_fragment() -> None:
    stream = _plain(100_000, 2_000)
    for ts_ms in (0, 1000, 1001, 50_000, 123_457, 199_998, 199_999, 10**9):
        lo, hi = search_range(stream.fragments, 0, stream.end, ts_ms)
        assert hi - lo <= 2_000
        answer, probes, reads = stream.seek(ts_ms)
        assert answer == stream.scan(ts_ms)
        assert probes == reads <= math.ceil(math.log2(2_000)) + 1


def test_without_recorded_timestamps_the_search_spans_the_stream_in_log_reads() -> None:
    stream = _plain(100_000, 2_000, recorded=False)
    for ts_ms in (0, 1001, 123_457, 10**9):
        assert search_range(stream.fragments, 0, stream.end, ts_ms) == (0, 100_000)
        answer, probes, _ = stream.seek(ts_ms)
        assert answer == stream.scan(ts_ms)
        assert probes <= math.ceil(math.log2(100_000)) + 1


def test_edges_first_retained_and_next_entry() -> None:
    stream = _plain(10, 4)
    # Before every entry: the first (retained) one; after every entry: the next id to write.
    assert stream.seek(0)[0] == 0
    assert stream.seek(1000)[0] == 0
    assert stream.seek(1018)[0] == 9
    assert stream.seek(1019)[0] == 10
    trimmed = Stream(8, [1016, 1018], set(), [Fragment(8, ENSEMBLE)])
    assert trimmed.seek(0)[0] == 8
    empty = Stream(5, [], set(), [Fragment(5, ENSEMBLE)])
    assert empty.seek(123) == (5, 0, 0)


def test_equal_timestamps_answer_the_first_of_them() -> None:
    # A writer whose clock was behind stamped the previous maximum: time stood still.
    stamps = [10, 20, 20, 20, 20, 30]
    stream = build(0, stamps, set(), [3, 3], [True, True])
    assert stream.seek(20)[0] == 1
    assert stream.seek(21)[0] == 5


def test_no_ops_are_skipped_forward() -> None:
    # The takeover's no-op at 3 (and a second one at 4) between two terms.
    stamps = [10, 11, 12, 99, 0, 13, 14]
    stream = build(0, stamps, {3, 4}, [7], [False])
    assert [stream.seek(t)[0] for t in (12, 13, 14, 15)] == [2, 5, 6, 7]
    assert stream.seek(12)[0] == bisect.bisect_left([10, 11, 12], 12)
