"""BookKeeper's RoundRobinDistributionScheduleTest.testCoverageSets, for QC and EC: every
E <= 7, WQ <= E, AQ <= WQ and every subset of responders, against a brute-force oracle."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from itertools import combinations

import pytest

from stream.errors import InvalidArgumentError
from stream.protocol.coverage import cohort_covered, coverage_threshold, is_covered
from stream.protocol.quorum import QuorumConfig

MAX_E = 7


def all_configs(max_e: int = MAX_E) -> Iterator[QuorumConfig]:
    for e in range(1, max_e + 1):
        for wq in range(1, e + 1):
            for aq in range(1, wq + 1):
                yield QuorumConfig(e, wq, aq)


def oracle_covered(cohort: Sequence[int], ack_quorum: int, satisfied: Collection[int]) -> bool:
    """Covered iff no AQ-subset of the cohort consists only of members that did not satisfy."""
    return not any(
        all(m not in satisfied for m in quorum) for quorum in combinations(cohort, ack_quorum)
    )


def test_config_count() -> None:
    assert sum(1 for _ in all_configs()) == 84


@pytest.mark.parametrize("ensemble", range(1, MAX_E + 1))
def test_coverage_sets_agree_with_oracle(ensemble: int) -> None:
    checked = 0
    for config in all_configs(ensemble):
        if config.ensemble != ensemble:
            continue
        e, aq = config.ensemble, config.ack_quorum
        for mask in range(1 << e):
            responders = frozenset(i for i in range(e) if mask >> i & 1)
            expected_ec = oracle_covered(range(e), aq, responders)
            assert config.ensemble_covered(responders) == expected_ec, (config, responders)
            assert cohort_covered(range(e), aq, responders) == expected_ec
            for entry_id in range(e):
                write_set = config.write_set(entry_id)
                expected_qc = oracle_covered(write_set, aq, responders)
                assert config.quorum_covered(entry_id, responders) == expected_qc, (
                    config,
                    entry_id,
                    responders,
                )
                assert cohort_covered(write_set, aq, responders) == expected_qc
                checked += 1
    assert checked == sum(
        ensemble * (1 << ensemble) for c in all_configs(ensemble) if c.ensemble == ensemble
    )


@pytest.mark.parametrize("config", list(all_configs()), ids=str)
def test_coverage_intersects_every_ack_quorum(config: QuorumConfig) -> None:
    # The reason coverage works (TigerBeetle asserts the same of its quorums): any covering set
    # meets every ack quorum of the cohort, so no AQ can have been missed.
    assert config.quorum_coverage + config.ack_quorum > config.write_quorum
    assert config.ensemble_coverage + config.ack_quorum > config.ensemble
    # And the thresholds are tight: one fewer leaves an AQ wholly outside.
    assert not is_covered(config.write_quorum, config.ack_quorum, config.quorum_coverage - 1)
    assert not is_covered(config.ensemble, config.ack_quorum, config.ensemble_coverage - 1)


def test_cohort_covered_ignores_outsiders() -> None:
    assert not cohort_covered(["a", "b", "c"], 2, {"a", "x", "y", "z"})
    assert cohort_covered(["a", "b", "c"], 2, {"a", "b", "x"})


def test_bad_coverage_arguments() -> None:
    with pytest.raises(InvalidArgumentError):
        coverage_threshold(3, 0)
    with pytest.raises(InvalidArgumentError):
        coverage_threshold(2, 3)
    with pytest.raises(InvalidArgumentError):
        is_covered(3, 2, 4)
    with pytest.raises(InvalidArgumentError):
        is_covered(3, 2, -1)
