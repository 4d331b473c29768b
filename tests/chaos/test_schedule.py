"""The nemesis schedule: drawn from the seed alone (a failing run replays), within the
duration, over the faults asked for, and without `tc netem` faults where the kernel has none."""

from __future__ import annotations

from stream.sandbox.chaos.nemesis import FAULTS, schedule


def _draw(seed: int, **kwargs: object) -> list[str]:
    options: dict[str, object] = {"bookies": 4, "writers": 2, "netem": True, **kwargs}
    return [str(step) for step in schedule(seed, 600.0, **options)]  # type: ignore[arg-type]


def test_the_same_seed_draws_the_same_schedule_and_another_seed_another() -> None:
    assert _draw(7) == _draw(7)
    assert _draw(7) != _draw(8)


def test_the_schedule_fits_the_duration_and_uses_only_the_faults_asked_for() -> None:
    steps = schedule(3, 120.0, bookies=4, writers=2, netem=True, faults=("kill-bookie", "loss"))
    assert steps
    assert sum(step.quiet_s + step.hold_s for step in steps) <= 120.0 + 0.1 * len(steps)
    assert {step.fault for step in steps} <= {"kill-bookie", "loss"}
    assert all(step.target.startswith("bookie-") for step in steps if step.fault == "kill-bookie")


def test_without_netem_no_delay_is_drawn() -> None:
    netem_faults = {name for name, needs_netem in FAULTS.items() if needs_netem}
    drawn = {step.fault for step in schedule(5, 3600.0, bookies=4, writers=2, netem=False)}
    assert netem_faults and not drawn & netem_faults
    assert len(drawn) > len(FAULTS) // 2


def test_a_writer_is_cut_from_two_distinct_bookies() -> None:
    steps = schedule(
        9, 300.0, bookies=4, writers=2, netem=False, faults=("writer-cut-from-bookies",)
    )
    for step in steps:
        writer, bookies = step.target.split(":")
        assert writer in ("writer-1", "writer-2")
        cut = bookies.split(",")
        assert len(set(cut)) == 2 and all(b in {f"bookie-{i}" for i in range(1, 5)} for b in cut)
