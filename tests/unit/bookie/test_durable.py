"""GroupWaits: the Add batches of one journal group wait on one loop-side future."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import threading
from typing import Any

import pytest

from stream.bookie.durable import GroupWaits


def _group() -> concurrent.futures.Future[Any]:
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    fut.set_running_or_notify_cancel()
    return fut


def test_the_batches_of_a_group_are_woken_by_one_hand_over() -> None:
    async def main() -> None:
        waits = GroupWaits()
        group = _group()
        batches = [asyncio.ensure_future(waits.wait(group)) for _ in range(3)]
        await asyncio.sleep(0)
        # One callback on the journal's future: one call_soon_threadsafe when it completes.
        assert len(group._done_callbacks) == 1  # type: ignore[attr-defined]
        threading.Thread(target=group.set_result, args=(None,)).start()
        await asyncio.gather(*batches)
        await waits.wait(group)  # done already: no wait
        await waits.wait(None)

    asyncio.run(main())


def test_a_cancelled_batch_leaves_the_others_of_its_group_waiting() -> None:
    async def main() -> None:
        waits = GroupWaits()
        group = _group()
        gone = asyncio.ensure_future(waits.wait(group))
        kept = asyncio.ensure_future(waits.wait(group))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        assert gone.cancelled() and not kept.done()
        group.set_result(None)
        await kept

    asyncio.run(main())


def test_a_failed_group_fails_each_of_its_batches() -> None:
    async def main() -> None:
        waits = GroupWaits()
        first, second = _group(), _group()
        batches = [asyncio.ensure_future(waits.wait(first)) for _ in range(2)]
        later = asyncio.ensure_future(waits.wait(second))
        await asyncio.sleep(0)
        first.set_exception(OSError("disk gone"))
        for batch in batches:
            with pytest.raises(OSError):
                await batch
        assert not later.done()
        second.set_result(None)
        await later

    asyncio.run(main())


def test_a_group_failing_after_its_batches_went_away_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every batch of a group cancelled (their Add streams ended with the bookie's stop),
    then the journal fails the group: the loop-side future's error was for nobody, and must
    not surface as asyncio's "Future exception was never retrieved" when it is collected."""

    async def main() -> None:
        waits = GroupWaits()
        group = _group()
        batch = asyncio.ensure_future(waits.wait(group))
        await asyncio.sleep(0)
        batch.cancel()
        await asyncio.sleep(0)
        group.set_exception(OSError("journal stopped"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(main())
        gc.collect()
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text
