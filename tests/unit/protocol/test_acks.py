"""PendingAdds: LAC/LAFR, in-order acknowledgment, the window and ensemble changes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream.errors import InvalidArgumentError
from stream.protocol.acks import PendingAdds
from stream.protocol.invariant import InvariantViolation
from stream.protocol.quorum import QuorumConfig

ENSEMBLE = ("b0", "b1", "b2")


E3_WQ3_AQ2 = QuorumConfig(3, 3, 2)


def tracker(
    config: QuorumConfig = E3_WQ3_AQ2, max_in_flight: int = 100, last: int = -1
) -> PendingAdds[str]:
    return PendingAdds(config, max_in_flight=max_in_flight, last_entry_id=last)


def add_entries(pending: PendingAdds[str], count: int, ensemble: tuple[str, ...]) -> None:
    for _ in range(count):
        entry_id = pending.next_entry_id
        pending.add(entry_id, E3_WQ3_AQ2.write_set_bookies(ensemble, entry_id))


def test_acknowledges_at_ack_quorum_in_id_order() -> None:
    pending = tracker()
    add_entries(pending, 3, ENSEMBLE)
    assert pending.on_ack(1, "b0") == []
    assert pending.on_ack(1, "b1") == []  # entry 1 is at AQ but entry 0 is not
    assert pending.lac == -1
    assert pending.on_ack(0, "b2") == []
    assert pending.on_ack(0, "b0") == [0, 1]
    assert pending.lac == 1
    assert pending.lafr == -1
    assert pending.on_ack(2, "b0") == []
    assert pending.on_ack(2, "b2") == [2]
    assert list(pending.unacknowledged()) == []


def test_lafr_moves_at_whole_write_set_and_frees_room() -> None:
    pending = tracker(max_in_flight=2)
    add_entries(pending, 2, ENSEMBLE)
    assert not pending.has_room()
    for bookie in ENSEMBLE:
        pending.on_ack(1, bookie)
    assert pending.lafr == -1  # entry 0 is not at WQ yet
    assert list(pending.entries_not_fully_replicated()) == [0, 1]
    for bookie in ENSEMBLE:
        pending.on_ack(0, bookie)
    assert (pending.lac, pending.lafr) == (1, 1)
    assert pending.in_flight == 0
    assert pending.has_room()
    # Late duplicates for forgotten entries are ignored.
    assert pending.on_ack(0, "b0") == []


def test_window_is_enforced() -> None:
    pending = tracker(max_in_flight=1)
    add_entries(pending, 1, ENSEMBLE)
    with pytest.raises(InvariantViolation):
        pending.add(1, ENSEMBLE)


def test_duplicate_and_foreign_acks_are_ignored() -> None:
    pending = tracker(QuorumConfig(3, 2, 2))
    pending.add(0, ("b0", "b1"))
    assert pending.on_ack(0, "b0") == []
    assert pending.on_ack(0, "b0") == []  # duplicate does not reach AQ=2
    assert pending.on_ack(0, "b2") == []  # not in the write set
    assert pending.ack_set(0) == frozenset({"b0"})
    assert pending.on_ack(0, "b1") == [0]


def test_ack_for_entry_never_added_is_a_bug() -> None:
    pending = tracker()
    add_entries(pending, 1, ENSEMBLE)
    with pytest.raises(InvariantViolation):
        pending.on_ack(1, "b0")


def test_adds_must_be_contiguous_with_wq_distinct_bookies() -> None:
    pending = tracker(last=9)
    assert (pending.lac, pending.lafr, pending.next_entry_id) == (9, 9, 10)
    with pytest.raises(InvariantViolation):
        pending.add(11, ENSEMBLE)
    with pytest.raises(InvariantViolation):
        pending.add(10, ("b0", "b0", "b1"))
    with pytest.raises(InvariantViolation):
        pending.add(10, ("b0", "b1"))
    pending.add(10, ENSEMBLE)
    assert pending.write_set(10) == ENSEMBLE


def test_bad_construction() -> None:
    with pytest.raises(InvalidArgumentError):
        tracker(max_in_flight=0)
    with pytest.raises(InvalidArgumentError):
        tracker(last=-2)
    with pytest.raises(InvalidArgumentError):
        tracker().write_set(0)


def test_replace_bookie_moves_unreplicated_entries() -> None:
    pending = tracker()
    add_entries(pending, 3, ENSEMBLE)
    for bookie in ENSEMBLE:
        pending.on_ack(0, bookie)
    pending.on_ack(1, "b2")  # entry 1 is not committed: b2 is not pinned
    assert pending.pinned_bookies() == frozenset()
    assert pending.replace_bookie("b2", "b3") == [1, 2]
    assert pending.write_set(1) == ("b1", "b3", "b0")  # same positions, b2's taken by b3
    assert pending.ack_set(1) == frozenset()
    # A late ack from the replaced bookie no longer counts.
    assert pending.on_ack(1, "b2") == []
    assert pending.on_ack(1, "b3") == []
    assert pending.on_ack(1, "b0") == [1]


def test_pinned_bookie_is_never_replaced() -> None:
    pending = tracker()
    add_entries(pending, 2, ENSEMBLE)
    pending.on_ack(0, "b0")
    pending.on_ack(0, "b1")  # committed at AQ, not at WQ
    pending.on_ack(1, "b2")
    assert pending.lac == 0
    assert pending.pinned_bookies() == frozenset({"b0", "b1"})
    with pytest.raises(InvariantViolation):
        pending.replace_bookie("b0", "b3")
    # b2 is not pinned: replacing it resends entries 0 and 1 to b3.
    assert pending.replace_bookie("b2", "b3") == [0, 1]
    pending.on_ack(0, "b3")
    assert pending.lafr == 0
    assert pending.pinned_bookies() == frozenset()


# --- property test against a brute-force oracle ----------------------------------------------


def brute_prefix(acks: dict[int, set[str]], sizes: dict[int, int], base: int) -> int:
    """Highest k such that every entry base+1..k has at least sizes[e] acks (base if none)."""
    k = base
    while k + 1 in acks and len(acks[k + 1]) >= sizes[k + 1]:
        k += 1
    return k


@settings(max_examples=300, deadline=None)
@given(
    e=st.integers(1, 5),
    data=st.data(),
    start=st.integers(-1, 20),
    window=st.integers(1, 8),
)
def test_matches_oracle_under_random_interleavings(
    e: int, data: st.DataObject, start: int, window: int
) -> None:
    wq = data.draw(st.integers(1, e))
    aq = data.draw(st.integers(1, wq))
    config = QuorumConfig(e, wq, aq)
    ensemble = [f"b{i}" for i in range(e)]
    fresh = iter(f"n{i}" for i in range(1000))
    pending: PendingAdds[str] = PendingAdds(config, max_in_flight=window, last_entry_id=start)

    write_sets: dict[int, tuple[str, ...]] = {}
    oracle_acks: dict[int, set[str]] = {}
    acknowledged: list[int] = []
    lac = lafr = start

    for _ in range(data.draw(st.integers(0, 60))):
        action = data.draw(st.sampled_from(["add", "ack", "ack", "ack", "replace"]))
        if action == "add" and pending.has_room():
            entry_id = pending.next_entry_id
            write_sets[entry_id] = config.write_set_bookies(ensemble, entry_id)
            oracle_acks[entry_id] = set()
            pending.add(entry_id, write_sets[entry_id])
        elif action == "ack" and write_sets:
            entry_id = data.draw(st.sampled_from(sorted(write_sets)))
            bookie = data.draw(st.sampled_from([*ensemble, "stranger", *write_sets[entry_id]]))
            if bookie in write_sets[entry_id]:
                oracle_acks[entry_id].add(bookie)
            newly = pending.on_ack(entry_id, bookie)
            acknowledged.extend(newly)
        elif action == "replace":
            failed = data.draw(st.sampled_from(ensemble))
            oracle_pinned = set().union(
                *(oracle_acks[x] for x in oracle_acks if lafr < x <= lac), set()
            )
            assert pending.pinned_bookies() == oracle_pinned
            if failed in oracle_pinned:
                with pytest.raises(InvariantViolation):
                    pending.replace_bookie(failed, "never")
                continue
            replacement = next(fresh)
            moved = [x for x in sorted(write_sets) if x > lafr and failed in write_sets[x]]
            for x in moved:
                write_sets[x] = tuple(replacement if b == failed else b for b in write_sets[x])
                oracle_acks[x].discard(failed)
            ensemble[ensemble.index(failed)] = replacement
            assert pending.replace_bookie(failed, replacement) == moved
        else:
            continue

        new_lac = brute_prefix(oracle_acks, dict.fromkeys(oracle_acks, aq), start)
        new_lafr = brute_prefix(oracle_acks, {x: wq for x in oracle_acks}, start)
        # LAC never moves back: the pin rule keeps every committed entry at AQ acks from its
        # current write set, even across ensemble changes.
        assert new_lac >= lac
        assert new_lafr >= lafr
        lac, lafr = new_lac, new_lafr
        assert pending.lac == lac
        assert pending.lafr == lafr
        assert acknowledged == list(range(start + 1, lac + 1))  # in order, each once
        assert list(pending.entries_not_fully_replicated()) == [
            x for x in sorted(write_sets) if x > lafr
        ]
        assert list(pending.unacknowledged()) == [x for x in sorted(write_sets) if x > lac]
        for x in pending.entries_not_fully_replicated():
            assert pending.write_set(x) == write_sets[x]
            assert pending.ack_set(x) == oracle_acks[x]
        assert pending.in_flight <= window


# --- on_acks (one answer at a time) against on_ack (one entry at a time) ----------------------


def test_on_acks_acknowledges_a_run_at_once() -> None:
    pending = tracker()
    add_entries(pending, 4, ENSEMBLE)
    assert pending.on_acks("b0", [0, 1, 2, 3]) == []
    assert pending.on_acks("b1", [1, 2]) == []  # entry 0 is not at AQ yet
    assert pending.on_acks("b2", [0]) == [0, 1, 2]
    assert pending.on_acks("b1", [0, 3]) == [3]
    assert pending.lafr == 0  # entry 0 has all three; entry 1 lacks b2
    assert pending.on_acks("b2", [1, 2, 3, 3]) == []
    assert pending.lafr == 3
    assert pending.on_acks("b0", [0, 1]) == []  # below LAFR: forgotten, ignored


def test_on_acks_for_an_entry_never_added_is_a_bug() -> None:
    pending = tracker()
    add_entries(pending, 2, ENSEMBLE)
    with pytest.raises(InvariantViolation):
        pending.on_acks("b0", [0, 1, 2])


@settings(max_examples=300, deadline=None)
@given(
    e=st.integers(1, 5),
    data=st.data(),
    start=st.integers(-1, 20),
    window=st.integers(1, 12),
)
def test_on_acks_equals_on_ack_per_entry(
    e: int, data: st.DataObject, start: int, window: int
) -> None:
    wq = data.draw(st.integers(1, e))
    aq = data.draw(st.integers(1, wq))
    config = QuorumConfig(e, wq, aq)
    ensemble = [f"b{i}" for i in range(e)]
    fresh = iter(f"n{i}" for i in range(1000))
    one: PendingAdds[str] = PendingAdds(config, max_in_flight=window, last_entry_id=start)
    batched: PendingAdds[str] = PendingAdds(config, max_in_flight=window, last_entry_id=start)
    acknowledged_one: list[int] = []
    acknowledged_batched: list[int] = []

    for _ in range(data.draw(st.integers(0, 40))):
        action = data.draw(
            st.sampled_from(["add", "run", "acks", "acks", "acks", "ranged", "replace"])
        )
        if action == "add" and one.has_room():
            entry_id = one.next_entry_id
            write_set = config.write_set_bookies(ensemble, entry_id)
            one.add(entry_id, write_set)
            batched.add(entry_id, write_set)
        elif action == "run" and one.has_room():
            # add_run is add for each entry in turn.
            assert batched.room() == window - batched.in_flight
            first = one.next_entry_id
            count = data.draw(st.integers(0, batched.room()))
            write_sets = [config.write_set_bookies(ensemble, first + i) for i in range(count)]
            for i, write_set in enumerate(write_sets):
                one.add(first + i, write_set)
            batched.add_run(first, write_sets)
        elif action == "acks":
            known = list(range(start + 1, one.next_entry_id))
            if not known:
                continue
            # Any ids ever added (also forgotten ones), repeated, in any order.
            ids = data.draw(st.lists(st.sampled_from(known), max_size=2 * window))
            bookie = data.draw(st.sampled_from([*ensemble, "stranger"]))
            for entry_id in ids:
                acknowledged_one.extend(one.on_ack(entry_id, bookie))
            acknowledged_batched.extend(batched.on_acks(bookie, ids))
        elif action == "ranged":
            # A ranged answer: the ids as a `range` (forgotten ones too), one span at once.
            known = list(range(start + 1, one.next_entry_id))
            if not known:
                continue
            low = data.draw(st.sampled_from(known))
            ids_range = range(low, data.draw(st.integers(low, one.next_entry_id)))
            bookie = data.draw(st.sampled_from([*ensemble, "stranger"]))
            for entry_id in ids_range:
                acknowledged_one.extend(one.on_ack(entry_id, bookie))
            acknowledged_batched.extend(batched.acknowledge(bookie, ids_range))
        elif action == "replace":
            failed = data.draw(st.sampled_from(ensemble))
            assert one.pinned_bookies() == batched.pinned_bookies()
            if failed in one.pinned_bookies():
                continue
            replacement = next(fresh)
            ensemble[ensemble.index(failed)] = replacement
            assert one.replace_bookie(failed, replacement) == batched.replace_bookie(
                failed, replacement
            )
        assert acknowledged_batched == acknowledged_one
        assert (batched.lac, batched.lafr, batched.next_entry_id) == (
            one.lac,
            one.lafr,
            one.next_entry_id,
        )
        for x in one.entries_not_fully_replicated():
            assert batched.write_set(x) == one.write_set(x)
            assert batched.ack_set(x) == one.ack_set(x)


def test_add_run_checks_like_add() -> None:
    pending = tracker(max_in_flight=4)
    with pytest.raises(InvariantViolation):
        pending.add_run(1, [ENSEMBLE])  # not next_entry_id
    with pytest.raises(InvariantViolation):
        pending.add_run(0, [ENSEMBLE] * 5)  # beyond max_in_flight
    with pytest.raises(InvariantViolation):
        pending.add_run(0, [("b0", "b0", "b1")])  # not WQ distinct bookies
    pending.add_run(0, [ENSEMBLE] * 4)
    assert (pending.next_entry_id, pending.room()) == (4, 0)


# --- answers (runs of ids) against the brute-force oracle ------------------------------------


@settings(max_examples=400, deadline=None)
@given(
    e=st.integers(1, 5),
    data=st.data(),
    start=st.integers(-1, 20),
    window=st.integers(1, 16),
)
def test_answers_match_oracle(e: int, data: st.DataObject, start: int, window: int) -> None:
    """`add_run` and `acknowledge` (what the writer's answers go through: mostly runs of
    consecutive ids, which split the tracker's runs where they start and end) against the
    oracle of per-entry ack sets, with ensemble changes in between."""
    wq = data.draw(st.integers(1, e))
    aq = data.draw(st.integers(1, wq))
    config = QuorumConfig(e, wq, aq)
    ensemble = [f"b{i}" for i in range(e)]
    fresh = iter(f"n{i}" for i in range(1000))
    pending: PendingAdds[str] = PendingAdds(config, max_in_flight=window, last_entry_id=start)
    write_sets: dict[int, tuple[str, ...]] = {}
    oracle_acks: dict[int, set[str]] = {}
    acknowledged: list[int] = []
    lac = lafr = start

    for _ in range(data.draw(st.integers(0, 50))):
        action = data.draw(st.sampled_from(["run", "answer", "answer", "answer", "replace"]))
        if action == "run":
            first = pending.next_entry_id
            count = data.draw(st.integers(0, pending.room()))
            # Mostly the ensemble's own striping; now and then one write set for all (E = WQ).
            same = data.draw(st.booleans()) and wq == e
            sets = [
                tuple(ensemble) if same else config.write_set_bookies(ensemble, first + i)
                for i in range(count)
            ]
            pending.add_run(first, sets)
            for i, write_set in enumerate(sets):
                write_sets[first + i] = write_set
                oracle_acks[first + i] = set()
        elif action == "answer" and write_sets:
            known = sorted(write_sets)
            bookie = data.draw(st.sampled_from([*ensemble, "stranger"]))
            if data.draw(st.booleans()):
                low = data.draw(st.sampled_from(known))
                high = data.draw(st.integers(low, known[-1]))
                ids = list(range(low, high + 1))
            else:
                ids = data.draw(st.lists(st.sampled_from(known), max_size=2 * window))
            for entry_id in ids:
                if entry_id > lafr and bookie in write_sets[entry_id]:
                    oracle_acks[entry_id].add(bookie)
            got = pending.acknowledge(bookie, ids)
            assert isinstance(got, range)
            acknowledged.extend(got)
        elif action == "replace":
            failed = data.draw(st.sampled_from(ensemble))
            oracle_pinned = set().union(
                *(oracle_acks[x] for x in oracle_acks if lafr < x <= lac), set()
            )
            assert pending.pinned_bookies() == oracle_pinned
            if failed in oracle_pinned:
                continue
            replacement = next(fresh)
            moved = [x for x in sorted(write_sets) if x > lafr and failed in write_sets[x]]
            for x in moved:
                write_sets[x] = tuple(replacement if b == failed else b for b in write_sets[x])
                oracle_acks[x].discard(failed)
            ensemble[ensemble.index(failed)] = replacement
            assert pending.replace_bookie(failed, replacement) == moved
        else:
            continue

        lac = brute_prefix(oracle_acks, dict.fromkeys(oracle_acks, aq), start)
        lafr = brute_prefix(oracle_acks, {x: len(write_sets[x]) for x in oracle_acks}, start)
        assert (pending.lac, pending.lafr) == (lac, lafr)
        assert acknowledged == list(range(start + 1, lac + 1))
        for x in pending.entries_not_fully_replicated():
            assert pending.write_set(x) == write_sets[x]
            assert pending.ack_set(x) == oracle_acks[x]
        assert pending.in_flight <= window


def test_acks_past_the_held_entries_are_a_bug_within_a_run() -> None:
    pending = tracker()
    pending.add_run(0, [ENSEMBLE] * 3)
    with pytest.raises(InvariantViolation):
        pending.acknowledge("b0", range(1, 4))  # id 3 was never added
    with pytest.raises(InvalidArgumentError):
        pending.write_set(3)
