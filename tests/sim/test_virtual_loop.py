"""The simulator's event loop runs asyncio code on virtual time, deterministically."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from stream.sim.loop import VirtualClock, run_simulated


async def _timers() -> list[tuple[str, float]]:
    loop = asyncio.get_running_loop()
    seen: list[tuple[str, float]] = []

    async def sleeper(name: str, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        seen.append((name, loop.time()))

    await asyncio.gather(sleeper("hour", 3600), sleeper("half", 0.5), sleeper("ten", 10))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.sleep(100), timeout=1)
    seen.append(("timeout", loop.time()))
    return seen


def test_virtual_time_orders_timers_without_sleeping() -> None:
    started = time.monotonic()
    seen = run_simulated(_timers())
    assert seen == [("half", 0.5), ("ten", 10.0), ("hour", 3600.0), ("timeout", 3601.0)]
    assert time.monotonic() - started < 5  # an hour of virtual time, no real waiting


def _random_schedule(seed: int) -> list[int]:
    async def run() -> list[int]:
        rng = random.Random(seed)
        order: list[int] = []

        async def task(i: int) -> None:
            for _ in range(5):
                await asyncio.sleep(rng.choice([0, 0.001, 0.01]))
                order.append(i)

        await asyncio.gather(*(task(i) for i in range(8)))
        return order

    return run_simulated(run(), VirtualClock())


def test_same_seed_same_schedule() -> None:
    assert _random_schedule(7) == _random_schedule(7)
    assert _random_schedule(7) != _random_schedule(8)


def test_idle_loop_with_nothing_scheduled_is_reported_as_deadlock() -> None:
    async def forever() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(RuntimeError, match="deadlocked"):
        run_simulated(forever())
