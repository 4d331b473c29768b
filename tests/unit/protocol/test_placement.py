"""Placement: distinct, writable, not excluded, least loaded, reproducible from the seed."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream.errors import InvalidArgumentError, NotEnoughBookiesError
from stream.protocol.placement import (
    BookieCandidate,
    choose_ensemble,
    choose_replacement,
    journal_required,
)


@st.composite
def candidate_lists(draw: st.DrawFn) -> list[BookieCandidate]:
    ids = draw(st.lists(st.sampled_from([f"bookie-{i}" for i in range(12)]), unique=True))
    return [
        BookieCandidate(bookie_id, draw(st.booleans()), draw(st.integers(0, 3)))
        for bookie_id in ids
    ]


@given(candidate_lists(), st.integers(1, 8), st.integers(0, 2**32), st.data())
def test_choose_ensemble_properties(
    candidates: list[BookieCandidate], size: int, seed: int, data: st.DataObject
) -> None:
    all_ids = [c.bookie_id for c in candidates]
    exclude = set(data.draw(st.lists(st.sampled_from(all_ids)) if all_ids else st.just([])))
    eligible = [c for c in candidates if c.writable and c.bookie_id not in exclude]
    if len(eligible) < size:
        with pytest.raises(NotEnoughBookiesError) as info:
            choose_ensemble(candidates, size, random.Random(seed), exclude)
        assert (info.value.context["needed"], info.value.context["available"]) == (
            size,
            len(eligible),
        )
        return
    chosen = choose_ensemble(candidates, size, random.Random(seed), exclude)
    assert len(chosen) == size
    assert len(set(chosen)) == size
    by_id = {c.bookie_id: c for c in candidates}
    assert all(by_id[b].writable and b not in exclude for b in chosen)
    # Load is spread: nothing left out is less loaded than something chosen.
    left_out = [c.load for c in eligible if c.bookie_id not in chosen]
    if left_out:
        assert max(by_id[b].load for b in chosen) <= min(left_out)
    # Reproducible from the seed, and independent of the registry's order.
    assert choose_ensemble(candidates, size, random.Random(seed), exclude) == chosen
    shuffled = data.draw(st.permutations(candidates))
    assert choose_ensemble(shuffled, size, random.Random(seed), exclude) == chosen


def test_ties_are_broken_by_the_rng_across_seeds() -> None:
    candidates = [BookieCandidate(f"b{i}") for i in range(6)]
    seen = {b for seed in range(200) for b in choose_ensemble(candidates, 3, random.Random(seed))}
    assert seen == {f"b{i}" for i in range(6)}
    orders = {choose_ensemble(candidates, 3, random.Random(seed)) for seed in range(50)}
    assert len(orders) > 10


def test_least_loaded_are_preferred() -> None:
    candidates = [
        BookieCandidate("busy", load=10),
        BookieCandidate("idle-1"),
        BookieCandidate("idle-2"),
        BookieCandidate("readonly", writable=False),
    ]
    for seed in range(20):
        assert set(choose_ensemble(candidates, 2, random.Random(seed))) == {"idle-1", "idle-2"}


def test_bad_arguments() -> None:
    rng = random.Random(1)
    with pytest.raises(InvalidArgumentError):
        choose_ensemble([BookieCandidate("a")], 0, rng)
    with pytest.raises(InvalidArgumentError):
        choose_ensemble([BookieCandidate("a"), BookieCandidate("a", load=1)], 1, rng)
    with pytest.raises(InvalidArgumentError):
        choose_replacement(("a", "b"), 2, [BookieCandidate("c")], rng)


@given(candidate_lists(), st.integers(0, 2**32), st.data())
def test_choose_replacement_properties(
    candidates: list[BookieCandidate], seed: int, data: st.DataObject
) -> None:
    ids = [c.bookie_id for c in candidates]
    ensemble = (
        tuple(data.draw(st.lists(st.sampled_from(ids), unique=True, min_size=1))) if ids else ("x",)
    )
    failed_index = data.draw(st.integers(0, len(ensemble) - 1))
    exclude = set(data.draw(st.lists(st.sampled_from(ids))) if ids else [])
    eligible = {
        c.bookie_id
        for c in candidates
        if c.writable and c.bookie_id not in ensemble and c.bookie_id not in exclude
    }
    if not eligible:
        with pytest.raises(NotEnoughBookiesError):
            choose_replacement(ensemble, failed_index, candidates, random.Random(seed), exclude)
        return
    replacement = choose_replacement(
        ensemble, failed_index, candidates, random.Random(seed), exclude
    )
    assert replacement in eligible
    assert replacement == choose_replacement(
        ensemble, failed_index, candidates, random.Random(seed), exclude
    )


# --- the journal rule (docs/design.md §4): AQ = 1 never on a journal-less bookie --------------


def test_only_ack_quorum_one_requires_the_journal() -> None:
    assert journal_required(1)
    assert not any(journal_required(aq) for aq in range(2, 6))


@given(candidate_lists(), st.integers(1, 6), st.integers(0, 2**32), st.data())
def test_needs_journal_places_only_on_journaled_bookies(
    candidates: list[BookieCandidate], size: int, seed: int, data: st.DataObject
) -> None:
    ids = [c.bookie_id for c in candidates]
    journal_less = set(data.draw(st.lists(st.sampled_from(ids)) if ids else st.just([])))
    candidates = [
        BookieCandidate(c.bookie_id, c.writable, c.load, journal=c.bookie_id not in journal_less)
        for c in candidates
    ]
    eligible = [c for c in candidates if c.writable and c.journal]
    if len(eligible) < size:
        with pytest.raises(NotEnoughBookiesError):
            choose_ensemble(candidates, size, random.Random(seed), needs_journal=True)
        return
    chosen = choose_ensemble(candidates, size, random.Random(seed), needs_journal=True)
    assert not set(chosen) & journal_less
    # Among journaled bookies only, the choice is the one made without the rule.
    journaled = [c for c in candidates if c.journal]
    assert chosen == choose_ensemble(journaled, size, random.Random(seed))


def test_needs_journal_says_why_when_only_journal_less_bookies_are_left() -> None:
    candidates = [BookieCandidate(f"b{i}", journal=i == 0) for i in range(4)]
    # Without the rule (AQ >= 2) journal-less bookies are fine.
    assert len(choose_ensemble(candidates, 3, random.Random(1))) == 3
    with pytest.raises(NotEnoughBookiesError, match="journal") as info:
        choose_ensemble(candidates, 3, random.Random(1), needs_journal=True)
    assert info.value.context == {"needed": 3, "available": 1, "journal_less": 3}
    assert choose_ensemble(candidates, 1, random.Random(1), needs_journal=True) == ("b0",)


def test_replacement_for_an_aq1_stream_has_the_journal() -> None:
    candidates = [BookieCandidate("a"), BookieCandidate("b"), BookieCandidate("c", journal=False)]
    for seed in range(20):
        assert (
            choose_replacement(("a", "x"), 1, candidates, random.Random(seed), needs_journal=True)
            == "b"
        )
    with pytest.raises(NotEnoughBookiesError, match="journal"):
        choose_replacement(("a", "b"), 1, candidates, random.Random(0), needs_journal=True)
