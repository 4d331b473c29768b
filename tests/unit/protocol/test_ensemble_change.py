"""Ensemble change planning and pinning (docs/design.md §5), and its agreement with PendingAdds."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream.errors import InvalidArgumentError
from stream.protocol.acks import PendingAdds
from stream.protocol.ensemble_change import next_to_replace, pinned_bookies, plan_ensemble_change
from stream.protocol.fragments import FragmentEnsemble, check_fragments, ensemble_for
from stream.protocol.quorum import QuorumConfig

FRAGMENTS = [FragmentEnsemble(0, ("b1", "b2", "b3")), FragmentEnsemble(10, ("b4", "b2", "b3"))]


def test_new_fragment_starts_after_lafr() -> None:
    change = plan_ensemble_change(FRAGMENTS, "b2", "b5", lafr=14)
    assert change is not None
    assert change.fragments == (*FRAGMENTS, FragmentEnsemble(15, ("b4", "b5", "b3")))
    assert (change.first_entry_id, change.replaced_index, change.replaces_last) == (15, 1, False)
    assert change.truncate_after_entry_id == 14


def test_new_fragment_replaces_last_with_the_same_first_id() -> None:
    change = plan_ensemble_change(FRAGMENTS, "b4", "b5", lafr=9)
    assert change is not None
    assert change.fragments == (FRAGMENTS[0], FragmentEnsemble(10, ("b5", "b2", "b3")))
    assert change.replaces_last


def test_first_fragment_of_a_new_stream_is_replaced() -> None:
    change = plan_ensemble_change([(0, ("a", "b"))], "a", "c", lafr=-1)
    assert change is not None
    assert change.fragments == (FragmentEnsemble(0, ("c", "b")),)
    assert change.truncate_after_entry_id == -1


def test_pinned_bookie_is_refused() -> None:
    assert plan_ensemble_change(FRAGMENTS, "b2", "b5", lafr=14, pinned={"b2"}) is None
    assert plan_ensemble_change(FRAGMENTS, "b3", "b5", lafr=14, pinned={"b2"}) is not None


@pytest.mark.parametrize(
    ("failed", "replacement", "lafr"),
    [
        ("b1", "b5", 14),  # not in the last ensemble
        ("b2", "b3", 14),  # replacement already a member
        ("b2", "b5", 8),  # LAFR before the last fragment
    ],
)
def test_invalid_changes_raise(failed: str, replacement: str, lafr: int) -> None:
    with pytest.raises(InvalidArgumentError):
        plan_ensemble_change(FRAGMENTS, failed, replacement, lafr=lafr)


def test_malformed_fragments_raise() -> None:
    with pytest.raises(InvalidArgumentError):
        plan_ensemble_change([], "a", "b", lafr=0)
    with pytest.raises(InvalidArgumentError):
        plan_ensemble_change([(0, ("a", "b")), (5, ("a", "c", "d"))], "a", "e", lafr=5)


def test_pinned_bookies_are_ackers_of_committed_moved_entries() -> None:
    ack_sets = {5: {"a"}, 6: {"a", "b"}, 7: {"c", "d"}, 8: {"e"}}
    assert pinned_bookies(ack_sets, lac=7, lafr=5) == frozenset({"a", "b", "c", "d"})
    assert pinned_bookies(ack_sets, lac=5, lafr=5) == frozenset()


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[QuorumConfig, list[FragmentEnsemble], int, str]:
    e = draw(st.integers(1, 5))
    wq = draw(st.integers(1, e))
    config = QuorumConfig(e, wq, draw(st.integers(1, wq)))
    pool = [f"b{i}" for i in range(12)]
    firsts = sorted(draw(st.lists(st.integers(1, 60), unique=True, max_size=4)))
    fragments = [
        FragmentEnsemble(first, tuple(draw(st.permutations(pool))[:e])) for first in [0, *firsts]
    ]
    lafr = draw(st.integers(fragments[-1].first_entry_id - 1, 90))
    failed = draw(st.sampled_from(fragments[-1].ensemble))
    return config, fragments, lafr, failed


@given(scenarios())
def test_plan_properties(scenario: tuple[QuorumConfig, list[FragmentEnsemble], int, str]) -> None:
    config, fragments, lafr, failed = scenario
    replacement = "fresh"
    change = plan_ensemble_change(fragments, failed, replacement, lafr=lafr)
    assert change is not None
    new = change.fragments
    check_fragments(new, config.ensemble)  # sorted, strictly increasing, constant size
    assert len(new) in (len(fragments), len(fragments) + 1)
    assert new[-1].first_entry_id == lafr + 1
    old_last, new_last = fragments[-1].ensemble, new[-1].ensemble
    assert [i for i in range(config.ensemble) if old_last[i] != new_last[i]] == [
        change.replaced_index
    ]
    assert new_last[change.replaced_index] == replacement
    for entry_id in range(0, lafr + 1):
        # Entries at or below LAFR keep their write sets.
        before = config.write_set_bookies(ensemble_for(fragments, entry_id), entry_id)
        after = config.write_set_bookies(ensemble_for(new, entry_id), entry_id)
        assert before == after
    for entry_id in range(lafr + 1, lafr + 2 * config.ensemble + 1):
        assert ensemble_for(new, entry_id) == new_last


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.data())
def test_plan_agrees_with_pending_adds(e: int, data: st.DataObject) -> None:
    """The writer's tracker and the fragment plan give every moved entry the same write set,
    and the plan is refused exactly for the tracker's pinned bookies."""
    wq = data.draw(st.integers(1, e))
    config = QuorumConfig(e, wq, data.draw(st.integers(1, wq)))
    fragments = [FragmentEnsemble(0, tuple(f"b{i}" for i in range(e)))]
    pending: PendingAdds[str] = PendingAdds(config, max_in_flight=64)
    for entry_id in range(data.draw(st.integers(0, 12))):
        pending.add(entry_id, config.write_set_bookies(fragments[-1].ensemble, entry_id))
    for _ in range(data.draw(st.integers(0, 40))):
        if not pending.next_entry_id:
            break
        entry_id = data.draw(st.integers(0, pending.next_entry_id - 1))
        pending.on_ack(entry_id, data.draw(st.sampled_from(fragments[-1].ensemble)))
    for step in range(data.draw(st.integers(1, 3))):
        failed = data.draw(st.sampled_from(fragments[-1].ensemble))
        replacement = f"n{step}"
        pinned = pending.pinned_bookies()
        change = plan_ensemble_change(
            fragments, failed, replacement, lafr=pending.lafr, pinned=pinned
        )
        if failed in pinned:
            assert change is None
            continue
        assert change is not None
        resend = pending.replace_bookie(failed, replacement)
        fragments = list(change.fragments)
        for entry_id in pending.entries_not_fully_replicated():
            expected = config.write_set_bookies(ensemble_for(fragments, entry_id), entry_id)
            assert pending.write_set(entry_id) == expected
            assert (entry_id in resend) == (replacement in expected)


def _subsets(items: tuple[str, ...]) -> list[frozenset[str]]:
    return [frozenset(c) for r in range(len(items) + 1) for c in itertools.combinations(items, r)]


@pytest.mark.parametrize("e", range(1, 6))
def test_next_to_replace_exhaustive(e: int) -> None:
    # Every ensemble of size e, every failed set (with bookies outside the ensemble too) and
    # every pinned set: an unpinned failed member goes first, in ensemble order; a pinned one
    # only when every failed member is pinned; None when no member failed.
    ensemble = tuple(f"b{i}" for i in range(e))
    outside = ("x",)
    for failed in _subsets(ensemble + outside):
        for pinned in _subsets(ensemble + outside):
            chosen = next_to_replace(ensemble, failed, pinned)
            down = [b for b in ensemble if b in failed]
            if not down:
                assert chosen is None
                continue
            assert chosen in down
            free = [b for b in down if b not in pinned]
            assert chosen == (free[0] if free else down[0])


def test_next_to_replace_takes_the_unpinned_one_first() -> None:
    # Issue 14 item 3: b1 is first but pinned; b3 can be replaced now.
    assert next_to_replace(("b1", "b2", "b3"), {"b1", "b3"}, {"b1", "b2"}) == "b3"
