"""A run leaves nothing behind on its loop: no task still pending and no coroutine dropped
unawaited, so that Python warns of nothing later (a library prints nothing). A 20,000-seed
run printed `coroutine 'SimTransport.truncate' was never awaited` once: seed 220's writer was
cancelled in the very loop turn it sent its new-member truncations."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

from stream.sim.loop import close_when_done, run_simulated
from stream.sim.runner import run_seed

# The seed the 20,000-seed run warned on (found again with warnings recorded, seeds 0-219
# clean), with its neighbours.
WARNED_SEEDS = (219, 220, 221)


@contextmanager
def _no_runtime_warning() -> Iterator[None]:
    """Fails when Python warned of anything at run time meanwhile (a coroutine never awaited,
    most of all), collected garbage included: a warning is an error here."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield
        gc.collect()
    warned = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    assert warned == []


def test_the_seeds_that_warned_leave_no_coroutine_unawaited() -> None:
    with _no_runtime_warning():
        for seed in WARNED_SEEDS:
            assert run_seed(seed).ok, seed


def test_a_coroutine_handed_to_a_task_cancelled_before_it_ran_is_closed() -> None:
    async def handed() -> None:
        pass

    async def wait(call: Coroutine[Any, Any, None]) -> None:
        await call

    async def main() -> None:
        call = handed()
        task = asyncio.ensure_future(wait(call))
        close_when_done(task, call)
        task.cancel()  # before its first step: it never awaits what it was handed
        await asyncio.sleep(0)

    with _no_runtime_warning():
        run_simulated(main())


def test_a_run_cancels_the_tasks_it_left_running() -> None:
    left: list[asyncio.Task[None]] = []

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            # Cancelled, it starts another task (as a writer's roll restarts): cancelled too.
            left.append(asyncio.ensure_future(asyncio.sleep(3600)))

    async def main() -> None:
        left.append(asyncio.ensure_future(forever()))
        await asyncio.sleep(1)

    with _no_runtime_warning():
        run_simulated(main())
    assert len(left) == 2
    assert all(task.cancelled() for task in left)
