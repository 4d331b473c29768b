"""QuorumConfig validation, write sets and striping."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream.errors import InvalidArgumentError
from stream.protocol.quorum import MAX_ENSEMBLE_SIZE, QuorumConfig


@st.composite
def configs(draw: st.DrawFn, max_ensemble: int = 8) -> QuorumConfig:
    e = draw(st.integers(1, max_ensemble))
    wq = draw(st.integers(1, e))
    aq = draw(st.integers(1, wq))
    return QuorumConfig(e, wq, aq)


@pytest.mark.parametrize(
    "args",
    [
        (0, 0, 0),
        (3, 3, 0),
        (3, 4, 2),
        (3, 2, 3),
        (2, 3, 3),
        (-1, 1, 1),
        (MAX_ENSEMBLE_SIZE + 1, 2, 2),
        (3.0, 3, 2),
        (3, True, 1),
        ("3", 3, 2),
    ],
)
def test_invalid_configs_are_rejected_with_context(args: tuple[Any, Any, Any]) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        QuorumConfig(*args)
    assert info.value.context["ensemble"] == args[0]
    assert info.value.context["write_quorum"] == args[1]
    assert info.value.context["ack_quorum"] == args[2]


def test_largest_config_is_accepted() -> None:
    config = QuorumConfig(MAX_ENSEMBLE_SIZE, MAX_ENSEMBLE_SIZE, 1)
    assert config.quorum_coverage == MAX_ENSEMBLE_SIZE


def test_coverages() -> None:
    config = QuorumConfig(5, 3, 2)
    assert config.quorum_coverage == 2
    assert config.ensemble_coverage == 4
    assert QuorumConfig(3, 3, 3).quorum_coverage == 1


def test_write_sets_match_the_reference_table() -> None:
    # bookkeeper-replication-protocol.txt: E=4, Qw=3 over B1..B4, entries 0..5.
    config = QuorumConfig(4, 3, 2)
    ensemble = ("B1", "B2", "B3", "B4")
    expected = [
        ("B1", "B2", "B3"),
        ("B2", "B3", "B4"),
        ("B3", "B4", "B1"),
        ("B4", "B1", "B2"),
        ("B1", "B2", "B3"),
        ("B2", "B3", "B4"),
    ]
    assert [config.write_set_bookies(ensemble, e) for e in range(6)] == expected


@given(configs(), st.integers(0, 10**12))
def test_write_set_is_the_round_robin_definition(config: QuorumConfig, entry_id: int) -> None:
    expected = tuple((entry_id + i) % config.ensemble for i in range(config.write_quorum))
    assert config.write_set(entry_id) == expected
    assert len(set(expected)) == config.write_quorum
    for index in range(config.ensemble):
        assert config.stores_entry(index, entry_id) == (index in expected)


def test_no_striping_has_one_write_set() -> None:
    config = QuorumConfig(3, 3, 2)
    assert {frozenset(config.write_set(e)) for e in range(10)} == {frozenset({0, 1, 2})}


def test_bad_arguments() -> None:
    config = QuorumConfig(3, 2, 2)
    with pytest.raises(InvalidArgumentError):
        config.write_set(-1)
    with pytest.raises(InvalidArgumentError):
        config.write_set_bookies(("a", "b"), 0)
    with pytest.raises(InvalidArgumentError):
        config.stores_entry(3, 0)
    with pytest.raises(InvalidArgumentError):
        list(config.bookie_index_entries(-1, 0, 5))
    with pytest.raises(InvalidArgumentError):
        list(config.bookie_index_entries(0, -1, 5))


@given(configs(), st.data(), st.integers(0, 200), st.integers(-1, 60))
def test_bookie_index_entries_agrees_with_write_sets(
    config: QuorumConfig, data: st.DataObject, first: int, length: int
) -> None:
    index = data.draw(st.integers(0, config.ensemble - 1))
    last = first + length - 1
    expected = [e for e in range(first, last + 1) if index in config.write_set(e)]
    assert list(config.bookie_index_entries(index, first, last)) == expected


def test_configs_are_values() -> None:
    assert QuorumConfig(3, 2, 2) == QuorumConfig(3, 2, 2)
    assert hash(QuorumConfig(3, 2, 2)) == hash(QuorumConfig(3, 2, 2))
    assert QuorumConfig(3, 2, 2) != QuorumConfig(3, 2, 1)
    assert repr(QuorumConfig(3, 2, 1)) == "QuorumConfig(ensemble=3, write_quorum=2, ack_quorum=1)"
