"""The retention arithmetic (stream/retention/policy.py): examples, properties over any sizes,
ages and policies, and a brute-force oracle that states the rules the plainest way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stream.retention.policy as policy_module
from stream.errors import InvalidArgumentError
from stream.metadata.model import Fragment, RetentionPolicy
from stream.retention.policy import (
    IdleAction,
    effective_last_timestamp_ms,
    fragments_below,
    held_back,
    idle_action,
    plan_retention,
)

NOW_MS = 1_800_000_000_000
MIB = 1 << 20
ENSEMBLE = ("b1", "b2", "b3")


def chain(
    sizes: list[int | None],
    last_ts: list[int | None] | None = None,
    created: list[int] | None = None,
    entries_each: int = 10,
) -> list[Fragment]:
    """Returns closed fragments of `entries_each` entries with `sizes` and an open last one."""
    fragments = []
    for i, size in enumerate(sizes):
        first = i * entries_each
        fragments.append(
            Fragment(
                first,
                ENSEMBLE,
                created_ms=created[i] if created else NOW_MS - 10_000_000,
                last_entry_id=first + entries_each - 1,
                bytes=size,
                last_timestamp_ms=last_ts[i] if last_ts else NOW_MS - 1_000,
            )
        )
    first = len(sizes) * entries_each
    created_last = created[-1] if created and len(created) > len(sizes) else NOW_MS
    fragments.append(Fragment(first, ENSEMBLE, created_ms=created_last))
    return fragments


# ---------------------------------------------------------------- examples


def test_size_keeps_the_newest_closed_fragments_that_fit() -> None:
    fragments = chain([MIB] * 50)
    plan = plan_retention(fragments, RetentionPolicy(max_bytes=5 * MIB), NOW_MS)
    assert plan.delete_count == 45
    assert plan.new_first_entry_id == 450
    assert sum(f.bytes or 0 for f in fragments[45:-1]) == 5 * MIB


def test_size_counts_the_fragment_that_does_not_fit_as_gone() -> None:
    fragments = chain([3 * MIB, 3 * MIB, 3 * MIB])
    plan = plan_retention(fragments, RetentionPolicy(max_bytes=5 * MIB), NOW_MS)
    assert plan.delete_count == 2  # only the newest 3 MiB fits
    plan = plan_retention(fragments, RetentionPolicy(max_bytes=2 * MIB), NOW_MS)
    assert plan.delete_count == 3  # nothing closed fits; the open last one stays


def test_age_uses_the_last_entry_timestamp_and_stops_at_the_first_young_fragment() -> None:
    hour = 3_600_000
    fragments = chain(
        [1, 1, 1, 1],
        last_ts=[NOW_MS - 5 * hour, NOW_MS - 4 * hour, NOW_MS - hour, NOW_MS - 3 * hour],
    )
    plan = plan_retention(fragments, RetentionPolicy(max_age_s=2 * 3600), NOW_MS)
    # The fourth is old enough, but the third is not and only a prefix can go.
    assert (plan.delete_count, plan.by_age, plan.by_size) == (2, 2, 0)


def test_age_exactly_at_the_limit_goes() -> None:
    fragments = chain([1], last_ts=[NOW_MS - 60_000])
    assert plan_retention(fragments, RetentionPolicy(max_age_s=60), NOW_MS).delete_count == 1
    assert plan_retention(fragments, RetentionPolicy(max_age_s=60.001), NOW_MS).delete_count == 0


def test_the_last_fragment_never_goes() -> None:
    only = [
        Fragment(0, ENSEMBLE, created_ms=1, last_entry_id=5, bytes=10 * MIB, last_timestamp_ms=1)
    ]
    assert plan_retention(only, RetentionPolicy(max_age_s=1, max_bytes=1), NOW_MS).empty
    assert plan_retention([], RetentionPolicy(max_bytes=1), NOW_MS).empty


def test_no_policy_or_no_limits_keeps_everything() -> None:
    fragments = chain([MIB] * 5, last_ts=[0] * 5)
    assert plan_retention(fragments, None, NOW_MS).empty
    assert plan_retention(fragments, RetentionPolicy(), NOW_MS).empty


def test_unknown_sizes_count_zero_and_unknown_ages_fall_back_to_the_next_creation() -> None:
    fragments = chain([None, None, MIB])
    assert plan_retention(fragments, RetentionPolicy(max_bytes=MIB), NOW_MS).empty
    # A fragment closed by an ensemble change has no totals: its age is the next's creation.
    unknown_age = [
        Fragment(0, ENSEMBLE, created_ms=1),
        Fragment(10, ENSEMBLE, created_ms=NOW_MS - 120_000),
        Fragment(20, ENSEMBLE, created_ms=NOW_MS - 1_000),
    ]
    assert effective_last_timestamp_ms(unknown_age, 0) == NOW_MS - 120_000
    assert effective_last_timestamp_ms(unknown_age, 2) is None
    plan = plan_retention(unknown_age, RetentionPolicy(max_age_s=60), NOW_MS)
    assert (plan.delete_count, plan.new_first_entry_id) == (1, 10)
    # Without a creation time on the next fragment the age is unknown: it stays.
    no_creation = [Fragment(0, ENSEMBLE, created_ms=1), Fragment(10, ENSEMBLE, created_ms=0)]
    assert plan_retention(no_creation, RetentionPolicy(max_age_s=60), NOW_MS).empty


def test_both_limits_take_whichever_drops_more() -> None:
    fragments = chain([MIB] * 6, last_ts=[0, 0, NOW_MS, NOW_MS, NOW_MS, NOW_MS])
    plan = plan_retention(fragments, RetentionPolicy(max_age_s=60, max_bytes=3 * MIB), NOW_MS)
    assert (plan.by_age, plan.by_size, plan.delete_count) == (2, 3, 3)
    plan = plan_retention(fragments, RetentionPolicy(max_age_s=60, max_bytes=5 * MIB), NOW_MS)
    assert (plan.by_age, plan.by_size, plan.delete_count) == (2, 1, 2)


def test_fragments_below_an_entry_id() -> None:
    fragments = chain([1, 1, 1])  # [0-9] [10-19] [20-29] [30-..)
    assert [fragments_below(fragments, b) for b in (0, 9, 10, 19, 20, 30, 10**9)] == [
        0,
        0,
        1,
        1,
        2,
        3,
        3,
    ]


def test_idle_actions() -> None:
    policy = RetentionPolicy(max_age_s=60)
    old = Fragment(100, ENSEMBLE, created_ms=NOW_MS - 120_000)
    young = Fragment(100, ENSEMBLE, created_ms=NOW_MS - 1_000)

    def act(
        last: Fragment, highest: int | None, ts: int | None, p: RetentionPolicy | None = policy
    ) -> IdleAction:
        return idle_action(last, p, NOW_MS, highest_entry_id=highest, newest_timestamp_ms=ts)

    assert act(old, 150, NOW_MS - 90_000) is IdleAction.TAKE_OVER
    assert act(old, 150, NOW_MS - 30_000) is IdleAction.YOUNG
    assert act(old, 99, None) is IdleAction.EMPTY  # the last fragment holds nothing
    assert act(old, -1, None) is IdleAction.EMPTY
    assert act(old, None, None) is IdleAction.UNKNOWN
    assert act(old, 150, None) is IdleAction.UNKNOWN
    assert act(young, 150, NOW_MS - 90_000) is IdleAction.KEEP  # cannot be that old yet
    assert act(old, 150, 0, RetentionPolicy(max_bytes=1)) is IdleAction.KEEP  # no age limit
    assert act(old, 150, 0, None) is IdleAction.KEEP
    closed = Fragment(100, ENSEMBLE, created_ms=1, last_entry_id=150, last_timestamp_ms=1)
    assert act(closed, 150, 0) is IdleAction.KEEP  # closed already: the plan handles it


def test_policy_module_is_pure() -> None:
    tree = ast.parse(Path(policy_module.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert not imported & {"time", "asyncio", "kazoo", "grpc", "os", "random", "threading"}
    assert imported <= {
        "__future__",
        "enum",
        "collections.abc",
        "dataclasses",
        "stream.metadata.model",
        "stream.protocol.invariant",
    }


# ---------------------------------------------------------------- properties


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[Fragment], RetentionPolicy | None, int]:
    """A stream's fragments (any sizes, timestamps, creation times, unknowns), a policy and a
    time."""
    count = draw(st.integers(0, 12))
    fragments = []
    first = draw(st.integers(0, 1000))
    for index in range(count):
        length = draw(st.integers(1, 50))
        last = index == count - 1
        closed = not last and draw(st.booleans())
        created = draw(st.one_of(st.just(0), st.integers(1, NOW_MS + 10_000)))
        fragments.append(
            Fragment(
                first,
                ENSEMBLE,
                created_ms=created,
                last_entry_id=first + length - 1 if closed else None,
                bytes=draw(st.one_of(st.none(), st.integers(0, 10 * MIB))) if closed else None,
                last_timestamp_ms=draw(st.one_of(st.none(), st.integers(0, NOW_MS + 10_000)))
                if closed
                else None,
            )
        )
        first += length
    max_age_s = draw(st.one_of(st.none(), st.floats(0.001, 10_000_000, allow_nan=False)))
    max_bytes = draw(st.one_of(st.none(), st.integers(1, 60 * MIB)))
    policy = draw(st.one_of(st.none(), st.just(RetentionPolicy(max_age_s, max_bytes))))
    now_ms = draw(st.integers(0, NOW_MS + 20_000))
    return fragments, policy, now_ms


def oracle(
    fragments: list[Fragment], policy: RetentionPolicy | None, now_ms: int
) -> tuple[int, int]:
    """The rules stated plainly: (most fragments age allows, fewest size requires)."""
    if policy is None or len(fragments) < 2:
        return 0, 0

    def age_of(i: int) -> int | None:
        f = fragments[i]
        if f.last_timestamp_ms is not None:
            return f.last_timestamp_ms
        created = fragments[i + 1].created_ms
        return created if created > 0 else None

    def old(i: int) -> bool:
        ts = age_of(i)
        return (
            policy.max_age_s is not None
            and ts is not None
            and now_ms - ts >= policy.max_age_s * 1000
        )

    closed = len(fragments) - 1
    by_age = max(k for k in range(closed + 1) if all(old(i) for i in range(k)))
    by_size = 0
    if policy.max_bytes is not None:
        by_size = min(
            k
            for k in range(closed + 1)
            if sum(f.bytes or 0 for f in fragments[k:closed]) <= policy.max_bytes
        )
    return by_age, by_size


@settings(max_examples=200, deadline=None)
@given(streams())
def test_plan_matches_the_oracle(case: tuple[list[Fragment], RetentionPolicy | None, int]) -> None:
    fragments, policy, now_ms = case
    plan = plan_retention(fragments, policy, now_ms)
    assert (plan.by_age, plan.by_size) == oracle(fragments, policy, now_ms)
    assert plan.delete_count == max(plan.by_age, plan.by_size)


@settings(max_examples=200, deadline=None)
@given(streams())
def test_plan_invariants(case: tuple[list[Fragment], RetentionPolicy | None, int]) -> None:
    fragments, policy, now_ms = case
    plan = plan_retention(fragments, policy, now_ms)
    # Never the last fragment; a prefix; the first retained entry is the first one kept.
    assert 0 <= plan.delete_count <= max(len(fragments) - 1, 0)
    if plan.delete_count:
        assert plan.new_first_entry_id == fragments[plan.delete_count].first_entry_id
    else:
        assert plan.new_first_entry_id is None
    if policy is None:
        assert plan.empty
        return
    kept_closed = fragments[plan.delete_count : -1]
    if policy.max_bytes is not None:
        # What stays fits the budget (plus the last fragment)...
        assert sum(f.bytes or 0 for f in kept_closed) <= policy.max_bytes
        # ...and size alone deletes nothing it could have kept.
        if plan.by_size:
            budget = sum(f.bytes or 0 for f in fragments[plan.by_size - 1 : -1])
            assert budget > policy.max_bytes
    if plan.delete_count > plan.by_size:
        # Age deleted these: each one's last entry is provably past the limit.
        assert policy.max_age_s is not None
        for i in range(plan.delete_count):
            ts = effective_last_timestamp_ms(fragments, i)
            assert ts is not None and now_ms - ts >= policy.max_age_s * 1000


@settings(max_examples=100, deadline=None)
@given(streams(), st.integers(0, 10**9), st.integers(1, 60 * MIB))
def test_plan_is_monotonic(
    case: tuple[list[Fragment], RetentionPolicy | None, int], later_ms: int, more_bytes: int
) -> None:
    """Time passing never deletes less; a larger size budget never deletes more."""
    fragments, policy, now_ms = case
    if policy is None:
        return
    plan = plan_retention(fragments, policy, now_ms)
    assert plan_retention(fragments, policy, now_ms + later_ms).delete_count >= plan.delete_count
    if policy.max_bytes is not None:
        looser = RetentionPolicy(policy.max_age_s, policy.max_bytes + more_bytes)
        assert plan_retention(fragments, looser, now_ms).by_size <= plan.by_size


@settings(max_examples=100, deadline=None)
@given(streams(), st.integers(0, 2000))
def test_fragments_below_never_deletes_an_entry_at_or_above_the_bound(
    case: tuple[list[Fragment], RetentionPolicy | None, int], before: int
) -> None:
    fragments, _, _ = case
    count = fragments_below(fragments, before)
    assert count <= max(len(fragments) - 1, 0)
    for i in range(count):
        assert fragments[i + 1].first_entry_id <= before  # every entry of fragment i is below
    if count < len(fragments) - 1:
        assert fragments[count + 1].first_entry_id > before  # maximal


@pytest.mark.parametrize("highest", [None, -1, 5, 99, 100, 10**6])
@pytest.mark.parametrize("ts_offset_ms", [None, 0, 59_999, 60_000, 10**7])
def test_idle_takeover_only_for_a_written_expired_fragment(
    highest: int | None, ts_offset_ms: int | None
) -> None:
    last = Fragment(100, ENSEMBLE, created_ms=NOW_MS - 10**8)
    ts = None if ts_offset_ms is None else NOW_MS - ts_offset_ms
    action = idle_action(
        last,
        RetentionPolicy(max_age_s=60),
        NOW_MS,
        highest_entry_id=highest,
        newest_timestamp_ms=ts,
    )
    written = highest is not None and highest >= 100
    expired = ts_offset_ms is not None and ts_offset_ms >= 60_000
    assert (action is IdleAction.TAKE_OVER) == (written and expired)
    if highest is not None and highest < 100:
        assert action is IdleAction.EMPTY


# ---------------------------------------------------------------- keep_unconsumed


def test_keep_unconsumed_spares_what_a_cursor_still_needs_within_max_bytes() -> None:
    old = NOW_MS - 10_000_000
    fragments = chain([MIB] * 10, last_ts=[old] * 10)  # all past the age limit
    age_only = RetentionPolicy(max_age_s=3600)
    keep = RetentionPolicy(max_age_s=3600, keep_unconsumed=True)
    assert plan_retention(fragments, age_only, NOW_MS, [24]).delete_count == 10
    # Entries 0..24 consumed: fragments 0 and 1 (0..19) may go, 2.. are still needed.
    plan = plan_retention(fragments, keep, NOW_MS, [24, 80])
    assert (plan.delete_count, plan.new_first_entry_id, plan.held_by_cursors) == (2, 20, 8)
    # No cursor, nothing held.
    assert plan_retention(fragments, keep, NOW_MS, []).delete_count == 10
    # Past max_bytes the oldest go anyway: 4 MiB keeps the newest four closed fragments.
    bounded = RetentionPolicy(max_age_s=3600, max_bytes=4 * MIB, keep_unconsumed=True)
    plan = plan_retention(fragments, bounded, NOW_MS, [24])
    assert (plan.delete_count, plan.by_size, plan.held_by_cursors) == (6, 6, 4)
    held = held_back(fragments, keep, NOW_MS, {"slow": 24, "fast": 80})
    assert held == {"slow": (8, 8 * MIB), "fast": (2, 2 * MIB)}
    assert held_back(fragments, age_only, NOW_MS, {"slow": 24}) == {}


def test_keep_unconsumed_round_trips_and_is_checked() -> None:
    policy = RetentionPolicy(max_bytes=MIB, keep_unconsumed=True)
    assert RetentionPolicy.from_dict(policy.to_dict()) == policy
    assert "keep_unconsumed" not in RetentionPolicy(max_bytes=MIB).to_dict()
    with pytest.raises(InvalidArgumentError):
        RetentionPolicy(keep_unconsumed="yes")  # type: ignore[arg-type]
