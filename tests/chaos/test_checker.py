"""The chaos checker on hand-made histories: clean ones pass, and each property's violation is
found (so a real run that breaks one cannot pass unnoticed)."""

from __future__ import annotations

from typing import Any

import pytest

from stream.sandbox.chaos.checker import FINAL, FINAL_READER, check
from stream.sandbox.chaos.history import ACK, FAIL, FAULT, HEAL, INVOKE, OPEN, READ, TERM_FIXED
from stream.sim.checker import (
    DURABILITY,
    NO_DIVERGENCE,
    PROGRESS,
    READER_AGREEMENT,
    SUPERSEDED_WRITER,
)


def ev(t: float, p: str, kind: str, **fields: Any) -> dict[str, Any]:
    return {"t": t, "p": p, "type": kind, **fields}


def acks(p: str, term: int, first_t: float, ids: range) -> list[dict[str, Any]]:
    out = []
    for i, entry_id in enumerate(ids):
        payload = f"{p}-{entry_id}"
        out.append(ev(first_t + i, p, INVOKE, v=payload))
        out.append(ev(first_t + i + 0.5, p, ACK, v=payload, e=entry_id, term=term))
    return out


def final_read(t: float, entries: dict[int, str], first: int = 0) -> list[dict[str, Any]]:
    last = max(entries, default=first - 1)
    reads = [ev(t, FINAL_READER, READ, seg=0, e=e, v=v) for e, v in sorted(entries.items())]
    return [*reads, ev(t + 1, "harness", FINAL, first=first, last=last)]


def props(events: list[dict[str, Any]], **kwargs: Any) -> set[str]:
    return {v.property for v in check(sorted(events, key=lambda e: e["t"]), **kwargs).violations}


def clean_history() -> list[dict[str, Any]]:
    events = [ev(0, "w1", OPEN, term=1), ev(0, "harness", TERM_FIXED, term=1, first=0)]
    events += acks("w1", 1, 1, range(0, 5))
    events += [ev(10 + e, "r1", READ, seg=0, e=e, v=f"w1-{e}") for e in range(0, 5)]
    events += final_read(30, {e: f"w1-{e}" for e in range(5)})
    return events


def test_a_clean_history_passes() -> None:
    verdict = check(sorted(clean_history(), key=lambda e: e["t"]))
    assert verdict.ok, verdict.violations
    assert (verdict.acks, verdict.reads, verdict.checked_entries) == (5, 10, 5)


def test_a_lost_acknowledged_entry_is_found() -> None:
    events = [e for e in clean_history() if not (e["p"] == FINAL_READER and e["e"] == 3)]
    # The final read also skipped an entry the tailing reader saw.
    assert props(events) == {DURABILITY, READER_AGREEMENT}


def test_an_entry_trimmed_by_retention_is_not_lost() -> None:
    events = [e for e in clean_history() if not (e["p"] == FINAL_READER and e["e"] < 2)]
    for event in events:
        if event["type"] == FINAL:
            event["first"] = 2
    assert props(events) == set()


def test_an_entry_acknowledged_twice_with_two_payloads_is_found() -> None:
    events = clean_history() + [ev(6, "w2", ACK, v="w2-x", e=4, term=2)]
    assert DURABILITY in props(events)


def test_a_changed_entry_read_back_is_found() -> None:
    events = clean_history() + [ev(20, "r2", READ, seg=0, e=2, v="other")]
    assert props(events) == {DURABILITY, NO_DIVERGENCE}


def test_two_readers_that_disagree_are_found() -> None:
    events = clean_history()
    events += [ev(11 + e, "r2", READ, seg=0, e=e, v=f"w1-{e}") for e in range(0, 5) if e != 2]
    assert props(events) == {READER_AGREEMENT}


def test_a_superseded_writer_acknowledged_after_the_new_terms_recovery_is_found() -> None:
    events = clean_history()
    # Term 2 took over at t=20 with its first entry 5; the old writer still got entry 6.
    events += [ev(20, "w2", OPEN, term=2), ev(20.5, "harness", TERM_FIXED, term=2, first=5)]
    events += [ev(21, "w1", ACK, v="w1-6", e=6, term=1)]
    assert SUPERSEDED_WRITER in props(events)


def test_an_old_terms_ack_before_the_new_terms_recovery_is_fine() -> None:
    events = clean_history()
    events += [ev(20, "w2", OPEN, term=2), ev(20.5, "harness", TERM_FIXED, term=2, first=5)]
    events += [ev(19, "w1", ACK, v="w1-4b", e=4, term=1)]
    assert SUPERSEDED_WRITER not in props(events)


def test_no_ack_after_a_heal_is_a_progress_violation() -> None:
    events = clean_history()
    events += [ev(6, "nemesis", FAULT, name="kill-bookie"), ev(7, "nemesis", HEAL)]
    events += [ev(7.5, "w1", FAIL, v="w1-9", term=1, error="AppendTimeoutError")]
    # Nothing acknowledged from the heal (t=7) to the end (t=31): a stall.
    assert props(events, progress_bound_s=10) == {PROGRESS}
    verdict = check(sorted(events, key=lambda e: e["t"]), progress_bound_s=10)
    assert verdict.faults == {"kill-bookie": 1}
    assert verdict.availability[0].to_first_failure_s is None  # the fail came after the heal


def test_acks_soon_after_a_heal_are_progress() -> None:
    events = clean_history()
    events += [ev(2.2, "nemesis", FAULT, name="pause-bookie"), ev(3.2, "nemesis", HEAL)]
    verdict = check(sorted(events, key=lambda e: e["t"]), progress_bound_s=10)
    assert verdict.ok, verdict.violations
    assert verdict.availability[0].to_first_ack_after_heal_s == pytest.approx(0.3)


def test_the_longest_stall_of_acknowledgments_during_a_fault_is_measured() -> None:
    events = clean_history()
    events += [ev(2.2, "nemesis", FAULT, name="pause-bookie"), ev(3.2, "nemesis", HEAL)]
    # Acks at 1.5, 2.5, 3.5...: from the fault (2.2) to the first ack after the heal (3.5).
    availability = check(sorted(events, key=lambda e: e["t"])).availability[0]
    assert availability.longest_ack_gap_s == pytest.approx(1.0)
