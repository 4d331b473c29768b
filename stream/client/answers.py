"""Bookie calls whose failure is an answer like any other (an unknown one), and calls that are
no longer needed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Sequence
from typing import Any, TypeVar

from stream.logs import get_logger

log = get_logger(__name__)

T = TypeVar("T")


async def answer_or_none(call: Awaitable[T]) -> T | None:
    """Returns the call's answer, or None when it raised (an unknown response: a timeout, a
    transport error, a bookie gone). Cancellation still propagates."""
    try:
        return await call
    except asyncio.CancelledError:
        raise
    except Exception as e:
        log.debug("client.request_failed", error=repr(e))
        return None


async def answers_or_none(calls: Iterable[Awaitable[T]]) -> list[T | None]:
    """Runs `calls` at once and returns each one's answer, None for each that raised (as
    `answer_or_none`). Cancellation still propagates.

    Each call is gathered as it is, not wrapped in `answer_or_none`: a wrapper task cancelled
    before its first step (its caller cancelled in the same loop turn) never awaits the call
    it was handed, and Python warns about that coroutine when it is dropped."""
    answers: list[T | None] = []
    for answer in await asyncio.gather(*calls, return_exceptions=True):
        if isinstance(answer, BaseException):
            if not isinstance(answer, Exception):
                raise answer  # a cancelled call: the caller is being cancelled
            log.debug("client.request_failed", error=repr(answer))
            answers.append(None)
        else:
            answers.append(answer)
    return answers


async def cancel_all(calls: Sequence[asyncio.Future[Any]]) -> None:
    """Cancels `calls` and returns once each has ended (their outcomes are dropped)."""
    for call in calls:
        call.cancel()
    if calls:
        await asyncio.gather(*calls, return_exceptions=True)
