"""The writer's open fragment: how many of the next appends fit (by entries, bytes and age; an
empty fragment always takes its first entry) and what a roll records when it closes it."""

from __future__ import annotations

import itertools

from stream.client.open_fragment import OpenFragment
from stream.metadata.model import Fragment, StreamMeta


class _Clock:
    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now


def _meta(
    max_entries: int = 10, max_bytes: int = 1000, max_age_s: float | None = None
) -> StreamMeta:
    return StreamMeta(
        name="s",
        id=1,
        ensemble=3,
        write_quorum=3,
        ack_quorum=2,
        fragment_max_entries=max_entries,
        fragment_max_bytes=max_bytes,
        fragment_max_age_s=max_age_s,
    )


def _prefix(sizes: list[int]) -> list[int]:
    return list(itertools.accumulate(sizes, initial=0))


def _room(open_: OpenFragment, sizes: list[int], next_entry_id: int, meta: StreamMeta) -> int:
    return open_.room(_prefix(sizes), 0, next_entry_id, meta, _Clock(0))


def test_room_by_entries_bytes_and_pending_bytes() -> None:
    open_ = OpenFragment(Fragment(100, ("a", "b", "c")), payload_bytes=0)
    # 10 entries at most: 4 in already (ids 100..103), 6 more fit.
    assert _room(open_, [1] * 8, 104, _meta()) == 6
    # Full once it reached 1000 bytes: with 900 written, 40-byte entries go in while the bytes
    # before each are below it (900, 940, 980), the fourth (at 1020) does not.
    open_.bytes = 900
    assert _room(open_, [40, 40, 40, 40], 104, _meta()) == 3
    # Bytes added by this drain and not yet counted take room too (960 before the first).
    assert open_.room(_prefix([40, 40]), 60, 104, _meta(), _Clock(0)) == 1
    open_.bytes = 1000
    assert _room(open_, [1], 104, _meta()) == 0


def test_an_empty_fragment_takes_its_first_entry_even_when_too_large() -> None:
    open_ = OpenFragment(Fragment(100, ("a", "b", "c")))
    assert _room(open_, [5000, 1], 100, _meta(max_bytes=1000)) == 1
    # Even when its byte count says full (bytes counted before its first entry).
    open_.bytes = 2000
    assert _room(open_, [10, 10], 100, _meta(max_bytes=1000)) == 1
    assert _room(open_, [10, 10], 101, _meta(max_bytes=1000)) == 0
    assert _room(open_, [], 100, _meta()) == 0


def test_a_fragment_is_full_once_its_first_entry_is_old() -> None:
    open_ = OpenFragment(Fragment(100, ("a", "b", "c")), first_ts=1_000)
    meta = _meta(max_age_s=2)
    assert not open_.too_old(meta, _Clock(2_999))
    assert open_.too_old(meta, _Clock(3_000))
    assert open_.room(_prefix([1, 1]), 0, 101, meta, _Clock(3_000)) == 0
    assert open_.room(_prefix([1, 1]), 0, 101, meta, _Clock(2_999)) == 2
    assert not OpenFragment(Fragment(100, ("a",))).too_old(meta, _Clock(10**9))  # empty


def test_closed_at_records_size_and_timestamps_unless_the_first_is_unknown() -> None:
    open_ = OpenFragment(
        Fragment(100, ("a", "b", "c"), created_ms=7),
        payload_bytes=500,
        first_ts=10,
        last_ts=20,
    )
    closed = open_.closed_at(120, ("a", "b", "d"))
    assert closed == Fragment(
        100,
        ("a", "b", "d"),
        created_ms=7,
        last_entry_id=120,
        bytes=500,
        first_timestamp_ms=10,
        last_timestamp_ms=20,
    )
    open_.first_known = False
    assert open_.closed_at(120, ("a", "b", "d")).first_timestamp_ms is None
