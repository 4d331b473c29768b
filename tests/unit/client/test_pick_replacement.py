"""The writer's and the takeover's choice of a replacement bookie (`pick_replacement`): never a
failed or tried one, never one replaced away by a change the metadata does not hold yet, a
quarantined one (replaced after failing) only when nothing else qualifies, and only journaled
bookies for an AQ = 1 stream."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from stream.client.bookie_placement import pick_replacement
from stream.client.options import Protections, WriterOptions
from stream.errors import NotEnoughBookiesError
from stream.protocol import BookieCandidate


@dataclass
class _Pipeline:
    ensemble: tuple[str, ...]
    failed: set[str] = field(default_factory=set)
    quarantined: set[str] = field(default_factory=set)
    unstored_away: set[str] = field(default_factory=set)


OPTIONS = WriterOptions()


def _pick(pipeline: _Pipeline, available: list[BookieCandidate], ack_quorum: int = 2) -> str:
    return pick_replacement(
        pipeline,  # type: ignore[arg-type]
        pipeline.ensemble[1],
        available,
        random.Random(0),
        tried=(),
        ack_quorum=ack_quorum,
        options=OPTIONS,
    )


def _bookies(*ids: str, journal: bool = True) -> list[BookieCandidate]:
    return [BookieCandidate(b, journal=journal) for b in ids]


def test_a_bookie_replaced_after_failing_is_not_chosen_while_another_can_be() -> None:
    # Two members froze together: b2 was replaced by b3; now b5 is replaced. b2 and b1 are
    # outside the ensemble; b2 just failed and must not come straight back.
    pipeline = _Pipeline(("b4", "b5", "b3"), failed={"b5"}, quarantined={"b2"})
    for seed in range(20):
        assert (
            pick_replacement(
                pipeline,  # type: ignore[arg-type]
                "b5",
                _bookies("b1", "b2", "b3", "b4", "b5"),
                random.Random(seed),
                tried=(),
                ack_quorum=2,
                options=OPTIONS,
            )
            == "b1"
        )


def test_a_quarantined_bookie_is_chosen_when_nothing_else_qualifies() -> None:
    pipeline = _Pipeline(("b4", "b5", "b3"), failed={"b5"}, quarantined={"b2"})
    assert _pick(pipeline, _bookies("b2", "b3", "b4", "b5")) == "b2"


def test_failed_and_tried_bookies_are_never_chosen() -> None:
    pipeline = _Pipeline(("b1", "b2", "b3"), failed={"b2", "b4"})
    with pytest.raises(NotEnoughBookiesError):
        _pick(pipeline, _bookies("b1", "b2", "b3", "b4"))
    with pytest.raises(NotEnoughBookiesError):
        pick_replacement(
            pipeline,  # type: ignore[arg-type]
            "b2",
            _bookies("b1", "b2", "b3", "b5"),
            random.Random(0),
            tried={"b5"},
            ack_quorum=2,
            options=OPTIONS,
        )


def test_an_ack_quorum_of_one_takes_only_journaled_replacements() -> None:
    pipeline = _Pipeline(("b1", "b2", "b3"), failed={"b2"})
    available = _bookies("b1", "b2", "b3") + _bookies("b4", journal=False) + _bookies("b5")
    assert _pick(pipeline, available, ack_quorum=1) == "b5"
    with pytest.raises(NotEnoughBookiesError):
        _pick(pipeline, available[:4], ack_quorum=1)
    assert _pick(pipeline, available[:4], ack_quorum=2) == "b4"


def test_a_bookie_replaced_away_by_an_unstored_change_never_comes_back() -> None:
    # Recovery replaced b4 locally (the stored fragment still names it, so its copies still
    # count); now b5 fails and only b4 is left. Its new-member truncation would strip those
    # copies: no replacement rather than that one (simulator seed 3813 lost entries so).
    pipeline = _Pipeline(
        ("b1", "b5", "b2"), failed={"b5"}, quarantined={"b4"}, unstored_away={"b4"}
    )
    with pytest.raises(NotEnoughBookiesError):
        _pick(pipeline, _bookies("b1", "b2", "b4", "b5"))
    pipeline.unstored_away.clear()  # the metadata holds the change now
    assert _pick(pipeline, _bookies("b1", "b2", "b4", "b5")) == "b4"
    unsafe = WriterOptions(protections=Protections(spare_holders=False))
    pipeline.unstored_away.add("b4")
    assert (
        pick_replacement(
            pipeline,  # type: ignore[arg-type]
            "b5",
            _bookies("b1", "b2", "b4", "b5"),
            random.Random(0),
            tried=(),
            ack_quorum=2,
            options=unsafe,
        )
        == "b4"
    )
