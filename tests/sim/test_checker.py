"""The checker finds each property's violation from synthetic observations, and nothing when
the observations agree."""

from __future__ import annotations

from stream.framing.prepare import NOOP_TRUNCATE, prepare_entry
from stream.metadata.model import Fragment, StreamMeta
from stream.protocol import QuorumConfig
from stream.sim.checker import (
    DURABILITY,
    MONOTONE_TIME,
    NO_DIVERGENCE,
    READER_AGREEMENT,
    SUPERSEDED_WRITER,
    Checker,
)
from stream.sim.trace import Trace
from stream.wire import bookie_pb2 as pb


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _checker() -> tuple[Checker, _Clock]:
    clock = _Clock()
    return Checker(Trace(clock), clock), clock


def _props(checker: Checker) -> list[str]:
    return [v.property for v in checker.violations]


def _meta(history: tuple[tuple[int, int], ...]) -> StreamMeta:
    return StreamMeta(
        name="s",
        id=1,
        ensemble=3,
        write_quorum=3,
        ack_quorum=2,
        fragment_max_entries=10,
        fragment_max_bytes=1 << 20,
        term=history[-1][0],
        term_history=history,
    )


def test_consistent_observations_pass() -> None:
    checker, clock = _checker()
    checker.on_ack("c1", 1, 0, b"a")
    checker.on_ack("c1", 1, 1, b"b")
    clock.now = 1.0
    checker.on_term_fixed(_meta(((1, 0), (2, 2))))
    checker.on_read("r1", 0, 2, [(0, b"a"), (1, b"b")])
    checker.on_read("r2", 1, 2, [(1, b"b")])
    checker.final(2, {0: b"a", 1: b"b"})
    assert checker.violations == []


def test_an_entry_acknowledged_twice_differently_breaks_durability() -> None:
    checker, _ = _checker()
    checker.on_ack("c1", 1, 0, b"a")
    checker.on_ack("c2", 2, 0, b"z")
    assert _props(checker) == [DURABILITY]


def test_lost_or_changed_entries_break_durability() -> None:
    checker, _ = _checker()
    checker.on_ack("c1", 1, 0, b"a")
    checker.on_ack("c1", 1, 1, b"b")
    checker.on_ack("c1", 1, 2, b"c")
    checker.final(1, {0: b"a"})  # 1 became a no-op, 2 is past the end
    assert _props(checker) == [DURABILITY, DURABILITY]


def test_superseded_writer_acknowledged_after_the_fix() -> None:
    checker, clock = _checker()
    clock.now = 1.0
    checker.on_term_fixed(_meta(((1, 0), (2, 5))))
    clock.now = 2.0
    checker.on_ack("c1", 1, 4, b"before the end")  # below the new term's first entry
    assert checker.violations == []
    checker.on_ack("c1", 1, 5, b"after the end")
    assert _props(checker) == [SUPERSEDED_WRITER]


def test_readers_disagreeing_and_diverging_reads() -> None:
    checker, _ = _checker()
    checker.on_ack("c1", 1, 1, b"b")
    checker.on_read("r1", 0, 2, [(0, b"a"), (2, b"c")])  # skipped 1 as a no-op
    assert _props(checker) == [NO_DIVERGENCE]
    checker.on_read("r2", 0, 2, [(0, b"a"), (1, b"b"), (2, b"X")])
    assert _props(checker) == [NO_DIVERGENCE, READER_AGREEMENT, READER_AGREEMENT]


def test_bookie_scan_finds_divergent_copies_in_the_write_set_only() -> None:
    checker, _ = _checker()
    checker.on_ack("c1", 1, 0, b"a")
    checker.on_ack("c1", 1, 1, b"b")
    held = {
        ("b1", 0): prepare_entry(1, 0, 0, 0, b"a").entry(),
        ("b2", 0): prepare_entry(1, 0, 0, 0, b"a").entry(),
        ("b9", 0): prepare_entry(1, 0, 0, 0, b"stale, outside the write set").entry(),
        ("b3", 1): prepare_entry(1, 1, NOOP_TRUNCATE, 0, b"").entry(),
    }

    def lookup(bookie_id: str, stream_id: int, entry_id: int) -> pb.Entry | None:
        return held.get((bookie_id, entry_id))

    fragments = [Fragment(0, ("b1", "b2", "b3"), created_ms=1)]
    checker.scan_bookies(1, QuorumConfig(3, 3, 2), fragments, lookup)
    assert _props(checker) == [NO_DIVERGENCE]
    assert "b3" in checker.violations[0].details and "no-op" in checker.violations[0].details
    checker.scan_bookies(1, QuorumConfig(3, 3, 2), fragments, lookup)
    assert len(checker.violations) == 1  # reported once


def test_timestamps_that_go_backwards_are_a_violation() -> None:
    checker, _ = _checker()
    checker.on_timestamps("r1", [(0, 10), (1, 10), (3, 12)])
    assert checker.violations == []
    checker.on_timestamps("r2", [(0, 10), (1, 12), (3, 11), (4, 9)])
    assert _props(checker) == [MONOTONE_TIME]
    assert "entry 3 is stamped 11, before entry 1 (12)" in checker.violations[0].details
