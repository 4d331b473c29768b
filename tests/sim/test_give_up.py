"""The needless-give-up property (`stream.sim.give_up`) judged from hand-built histories: a
writer's pipeline samples (which failed members were pinned) and the run's fault history. It
flags a writer that gave up on a pinned member while another failed member was not pinned and
a spare was usable the whole time, and nothing when any of those is missing."""

from __future__ import annotations

from dataclasses import dataclass, field

from stream.sim.checker import NEEDLESS_GIVE_UP, Checker
from stream.sim.fault_history import FaultHistory
from stream.sim.give_up import MIN_SPAN_S, GiveUp, PinWatch, Sampled, needless_give_up
from stream.sim.network import ZK_NODE
from stream.sim.trace import Trace

ENSEMBLE = ("b1", "b2", "b3")
SPARES = ("b4", "b5")


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class _Pending:
    pinned: frozenset[str] = frozenset()

    def pinned_bookies(self) -> frozenset[str]:
        return self.pinned


@dataclass
class _Pipeline:
    """What `PinWatch` reads of an `AddPipeline`."""

    ensemble: tuple[str, ...] = ENSEMBLE
    failed: set[str] = field(default_factory=set)
    unstored_away: set[str] = field(default_factory=set)
    pending: _Pending = field(default_factory=_Pending)
    closed: bool = False


def _sampled(pinned_from: float, unpinned_from: float, last: float) -> Sampled:
    """B1 failed pinned since `pinned_from`, B3 failed unpinned since `unpinned_from`, sampled
    every 10 ms up to `last`."""
    watch, pipeline = PinWatch(), _Pipeline()
    now = 0.0
    while now <= last + 1e-9:
        pipeline.failed = {
            b for b, since in (("b1", pinned_from), ("b3", unpinned_from)) if now >= since
        }
        pipeline.pending = _Pending(frozenset({"b1"}))
        watch.sample("c1", pipeline, now)  # type: ignore[arg-type]  # the pipeline's duck type
        now = round(now + 0.01, 6)
    seen = watch.sampled("c1")
    assert seen is not None
    return seen


def _give_up(at: float) -> GiveUp:
    return GiveUp("c1", 1, at, "b1")


def test_waiting_on_a_pinned_member_with_an_unpinned_one_and_a_spare_is_needless() -> None:
    seen = _sampled(0.1, 0.3, 0.6)
    details = needless_give_up(_give_up(0.61), seen, FaultHistory(lambda: 0.0), SPARES)
    assert details is not None and "b3 had failed unpinned" in details and "spare b4" in details


def test_the_checker_reports_it_once() -> None:
    clock = _Clock()
    checker = Checker(Trace(clock), clock)
    seen = _sampled(0.1, 0.3, 0.6)
    clock.now = 0.61
    for _ in range(3):  # every pending append fails with the same error
        checker.on_give_up(_give_up(0.61), seen, FaultHistory(clock), SPARES)
    assert [v.property for v in checker.violations] == [NEEDLESS_GIVE_UP]


def test_no_spare_usable_the_whole_time_is_no_needless_give_up() -> None:
    clock = _Clock()
    history = FaultHistory(clock)
    seen = _sampled(0.1, 0.3, 0.6)
    # B4 down for a moment, B5 cut off from the writer for a moment: neither usable throughout.
    clock.now = 0.4
    history.start("down", "b4", duration_s=0.01)
    history.start("cut", "b5", "c1", duration_s=0.01)
    assert needless_give_up(_give_up(0.61), seen, history, SPARES) is None
    # A fault that ended before the unpinned member failed does not count.
    assert needless_give_up(_give_up(0.61), seen, FaultHistory(clock), SPARES) is not None
    early = FaultHistory(clock)
    clock.now = 0.2
    early.start("read_only", "b4")
    early.start("unregistered", "b5", duration_s=0.05)
    clock.now = 0.25
    early.end("read_only", "b4")
    assert needless_give_up(_give_up(0.61), seen, early, SPARES) is not None


def test_a_spare_in_the_ensemble_or_replaced_away_is_no_spare() -> None:
    seen = _sampled(0.1, 0.3, 0.6)
    history = FaultHistory(lambda: 0.0)
    assert needless_give_up(_give_up(0.61), seen, history, ENSEMBLE) is None
    seen.unstored_away = frozenset(SPARES)
    assert needless_give_up(_give_up(0.61), seen, history, SPARES) is None


def test_the_writer_cut_from_the_metadata_or_paused_is_no_needless_give_up() -> None:
    clock = _Clock()
    seen = _sampled(0.1, 0.3, 0.6)
    for key in (("cut", "c1", ZK_NODE), ("pause", "c1"), ("session", "c1")):
        history = FaultHistory(clock)
        clock.now = 0.5
        history.start(*key, duration_s=0.01)
        assert needless_give_up(_give_up(0.61), seen, history, SPARES) is None, key


def test_an_unpinned_member_failed_only_just_before_is_no_needless_give_up() -> None:
    # The writer looks again every 50 ms: one that failed less than MIN_SPAN_S ago may not
    # have been seen yet by a writer that replaces unpinned members first.
    seen = _sampled(0.1, 0.6 - MIN_SPAN_S + 0.02, 0.6)
    assert needless_give_up(_give_up(0.61), seen, FaultHistory(lambda: 0.0), SPARES) is None


def test_a_give_up_on_an_unpinned_member_or_long_after_the_samples_is_not_judged() -> None:
    seen = _sampled(0.1, 0.3, 0.6)
    history = FaultHistory(lambda: 0.0)
    assert needless_give_up(GiveUp("c1", 1, 0.61, "b3"), seen, history, SPARES) is None
    assert needless_give_up(_give_up(0.7), seen, history, SPARES) is None


def test_a_member_pinned_only_after_the_other_failed_is_not_judged() -> None:
    # B1 pinned only after B3 failed: the writer may have started on B3, then B1.
    seen = _sampled(0.4, 0.2, 0.6)
    assert needless_give_up(_give_up(0.61), seen, FaultHistory(lambda: 0.0), SPARES) is None


def test_a_sample_that_misses_the_state_starts_it_again() -> None:
    watch, pipeline = (
        PinWatch(),
        _Pipeline(failed={"b1", "b3"}, pending=_Pending(frozenset({"b1"}))),
    )
    watch.sample("c1", pipeline, 0.1)  # type: ignore[arg-type]
    pipeline.pending = _Pending(frozenset({"b1", "b3"}))  # b3 pinned for a moment
    watch.sample("c1", pipeline, 0.2)  # type: ignore[arg-type]
    pipeline.pending = _Pending(frozenset({"b1"}))
    watch.sample("c1", pipeline, 0.3)  # type: ignore[arg-type]
    seen = watch.sampled("c1")
    assert seen is not None
    assert seen.unpinned_since == {"b3": 0.3} and seen.pinned_since == {"b1": 0.1}


def test_fault_history_spans() -> None:
    clock = _Clock()
    history = FaultHistory(clock)
    history.start("cut", "a", "b", duration_s=1.0)
    history.start("hold_adds", "a", "c")
    clock.now = 0.5
    history.end("hold_adds", "a", "c")
    assert not history.link_clear("b", "a", 0.9, 2.0)  # either direction
    assert history.link_clear("a", "b", 1.01, 2.0)
    assert not history.link_clear("a", "c", 0.4, 0.45)
    assert history.link_clear("a", "c", 0.51, 9.0)
    history.start("pause", "c")
    clock.now = 0.7
    history.end_all(("pause",))
    assert not history.link_clear("a", "c", 0.6, 0.6)
    assert history.link_clear("a", "c", 0.71, 9.0)
