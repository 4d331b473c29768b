"""`answers_or_none`: a fan-out of bookie calls whose failures are unknown answers, and whose
caller may be cancelled in the very loop turn it started them without leaving a coroutine
unawaited (found by simulator seed 220: `SimTransport.truncate` was never awaited)."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

from stream.client.answers import answers_or_none


async def _answer(value: int) -> int:
    await asyncio.sleep(0)
    return value


async def _fail() -> int:
    raise ConnectionError("bookie gone")


def test_failed_calls_answer_none_in_order() -> None:
    async def main() -> list[int | None]:
        return await answers_or_none([_answer(1), _fail(), _answer(3)])

    assert asyncio.run(main()) == [1, None, 3]


def test_a_caller_cancelled_before_its_calls_started_leaves_no_coroutine_unawaited() -> None:
    async def caller() -> None:
        await answers_or_none(_answer(i) for i in range(3))

    async def main() -> None:
        task = asyncio.ensure_future(caller())
        await asyncio.sleep(0)  # the caller started its calls; none has run a step yet
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        asyncio.run(main())
        gc.collect()
    assert [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)] == []
