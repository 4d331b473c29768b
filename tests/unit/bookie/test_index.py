"""The LMDB index's range look-ups, against a model of which entries are stored."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from stream.bookie.storage.codec import ENTRY_KEY, LOCATION
from stream.bookie.storage.index import Index


def _location(stream_id: int, entry_id: int) -> bytes:
    return LOCATION.pack(stream_id, entry_id * 100, entry_id + 1)


@settings(max_examples=300, deadline=None)
@given(
    stored=st.dictionaries(
        st.sampled_from([6, 7, 8]), st.sets(st.integers(0, 60), max_size=40), max_size=3
    ),
    first=st.integers(0, 62),
    count=st.integers(0, 70),
)
# A run that reaches the database's end (stream 7 the last one), and one cut by a gap.
@example(stored={7: {3, 4, 5}}, first=3, count=10)
@example(stored={7: {3, 4, 6}, 8: {0}}, first=3, count=10)
def test_consecutive_is_the_run_of_stored_ids_from_first(
    stored: dict[int, set[int]], first: int, count: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        index = Index(Path(tmp) / "index")
        index.open()
        try:
            keys = sorted(ENTRY_KEY.pack(s, e) for s, ids in stored.items() for e in ids)
            locations = [_location(*ENTRY_KEY.unpack(k)) for k in keys]
            index.commit_flush(keys, locations, {}, None)
            held = stored.get(7, set())
            expected = []
            entry_id = first
            while entry_id in held and len(expected) < count:
                expected.append(_location(7, entry_id))
                entry_id += 1
            assert index.consecutive(7, first, count) == expected
            # The dict form the repair uses agrees on the same range.
            if expected:
                last = first + len(expected) - 1
                assert list(index.locations(7, first, last, count).values()) == expected
        finally:
            index.close()
