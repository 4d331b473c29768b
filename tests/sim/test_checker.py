"""The checker finds each property's violation from synthetic observations, and nothing when
the observations agree."""

from __future__ import annotations

from stream.framing.prepare import NOOP_TRUNCATE, prepare_entry
from stream.metadata.model import Fragment, StreamMeta
from stream.protocol import QuorumConfig
from stream.sim.checker import (
    DURABILITY,
    LOG_DIVERGENCE,
    MONOTONE_TIME,
    NO_DIRTY_READ,
    NO_DIVERGENCE,
    READER_AGREEMENT,
    SUPERSEDED_WRITER,
    WRITE_QUORUM,
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


def _entry(entry_id: int, payload: bytes) -> pb.Entry:
    return prepare_entry(1, entry_id, 0, 0, payload).entry()


def test_a_read_past_the_fixed_end_is_a_dirty_read() -> None:
    checker, _ = _checker()
    checker.on_ack("c1", 1, 0, b"a")
    # r1 read e1 = "dirty" (a writer's unacknowledged entry) before the recovery ended at 0.
    checker.on_read("r1", 0, 1, [(0, b"a"), (1, b"dirty")])
    assert checker.violations == []
    checker.final(0, {0: b"a"})
    assert _props(checker) == [NO_DIRTY_READ]
    assert "entry 1 (b'dirty')" in checker.violations[0].details


def test_a_skipped_noop_past_the_end_is_no_dirty_read() -> None:
    checker, _ = _checker()
    checker.on_read("r1", 0, 1, [(0, b"a")])  # 1 skipped: a no-op
    checker.final(0, {0: b"a"})
    assert checker.violations == []


def test_a_closed_fragment_missing_an_entry_on_its_write_set_breaks_write_quorum() -> None:
    checker, _ = _checker()
    fragments = [
        Fragment(0, ("b1", "b2", "b3"), created_ms=1, last_entry_id=1),
        Fragment(2, ("b1", "b2", "b4"), created_ms=2),
    ]
    held = {(b, e): _entry(e, b"x") for b in ("b1", "b2", "b3") for e in (0, 1)}
    held |= {("b1", 2): _entry(2, b"y"), ("b4", 2): _entry(2, b"y")}  # the open fragment: AQ
    config = QuorumConfig(3, 3, 2)
    checker.check_write_quorum(config, fragments, 0, lambda b, e: held.get((b, e)))
    assert checker.violations == []
    del held[("b3", 1)]  # acknowledged by b1, b2 (AQ) but never reached b3
    checker.check_write_quorum(config, fragments, 0, lambda b, e: held.get((b, e)))
    assert _props(checker) == [WRITE_QUORUM]
    assert "entry 1" in checker.violations[0].details and "['b3']" in checker.violations[0].details
    checker.check_write_quorum(config, fragments, 2, lambda b, e: held.get((b, e)))
    assert len(checker.violations) == 1  # trimmed below 2: nothing left to check


def test_bookies_disagreeing_below_the_lac_is_log_divergence_acknowledged_or_not() -> None:
    checker, _ = _checker()
    fragments = [Fragment(0, ("b1", "b2", "b3"), created_ms=1)]
    # Nothing acknowledged to the application: property 2 cannot see it, property 8 does.
    held = {
        ("b1", 0): _entry(0, b"a"),
        ("b2", 0): _entry(0, b"a"),
        ("b1", 1): _entry(1, b"recovered"),
        ("b3", 1): _entry(1, b"dirty"),
        ("b1", 2): _entry(2, b"above the LAC"),
        ("b2", 2): _entry(2, b"differs, not committed"),
    }

    def lookup(bookie_id: str, entry_id: int) -> pb.Entry | None:
        return held.get((bookie_id, entry_id))

    checker.scan_log(QuorumConfig(3, 3, 2), fragments, 0, 1, lookup)
    assert _props(checker) == [LOG_DIVERGENCE]
    assert "entry 1" in checker.violations[0].details
    checker.scan_log(QuorumConfig(3, 3, 2), fragments, 0, 1, lookup)
    assert len(checker.violations) == 1  # reported once


# Trims and deletes (issue 15's fault space): what they take away on purpose is not a
# violation, and only that.


def test_trimmed_acknowledged_entries_are_not_lost() -> None:
    checker, _ = _checker()
    for entry_id in range(4):
        checker.on_ack("c1", 1, entry_id, b"e%d" % entry_id)
    checker.on_trim(2)
    checker.final(3, {2: b"e2", 3: b"e3"})
    assert checker.violations == []
    # Not below the trim: an acknowledged entry the final read lacks is still lost.
    checker.final(3, {3: b"e3"})
    assert _props(checker) == [DURABILITY]


def test_an_untrimmed_entry_missing_from_the_final_read_is_lost() -> None:
    checker, _ = _checker()
    checker.on_ack("c1", 1, 0, b"e0")
    checker.final(0, {})
    assert _props(checker) == [DURABILITY]


def test_a_read_of_a_trimmed_range_skips_no_entry() -> None:
    checker, _ = _checker()
    for entry_id in range(4):
        checker.on_ack("c1", 1, entry_id, b"e%d" % entry_id)
    checker.on_read("r1", 2, 3, [(2, b"e2"), (3, b"e3")])
    # The range was trimmed below 2 while r2 read it: it returned nothing for 0 and 1.
    checker.on_trim(2)
    checker.on_read("r2", 0, 3, [(2, b"e2"), (3, b"e3")])
    assert checker.violations == []
    # Returned data below the trim is still judged, and a gap above it is still a no-op.
    checker.on_read("r3", 0, 3, [(1, b"other"), (3, b"e3")])
    assert _props(checker) == [NO_DIVERGENCE, NO_DIVERGENCE, READER_AGREEMENT]


def test_a_gap_in_a_read_of_an_untrimmed_range_is_a_skipped_entry() -> None:
    checker, _ = _checker()
    checker.on_ack("c1", 1, 0, b"e0")
    checker.on_read("r1", 0, 0, [])
    assert _props(checker) == [NO_DIVERGENCE]


def test_a_trim_never_moves_back() -> None:
    checker, _ = _checker()
    checker.on_trim(5)
    checker.on_trim(3)
    assert checker.first_retained == 5


def test_a_deleted_stream_has_nothing_left_to_lose() -> None:
    checker, _ = _checker()
    checker.on_ack("c1", 1, 0, b"e0")
    checker.on_read("r1", 0, 1, [(0, b"e0"), (1, b"dirty")])
    checker.on_deleted()
    checker.final(-1, {})
    assert checker.violations == []
    # What was judged while it lived stands.
    checker.on_read("r2", 0, 0, [(0, b"other")])
    assert _props(checker) == [NO_DIVERGENCE, READER_AGREEMENT]


def test_a_live_stream_is_judged_at_its_end() -> None:
    checker, _ = _checker()
    checker.on_ack("c1", 1, 0, b"e0")
    checker.on_read("r1", 0, 1, [(0, b"e0"), (1, b"dirty")])
    checker.final(-1, {})
    assert _props(checker) == [NO_DIRTY_READ, DURABILITY]


def test_a_further_streams_violations_name_it() -> None:
    clock = _Clock()
    checker = Checker(Trace(clock), clock, stream="sim2")
    checker.on_ack("c1", 1, 0, b"e0")
    checker.final(-1, {})
    assert checker.violations[0].details.startswith("stream sim2: entry 0")
