"""Bookie calls whose failure is an answer like any other (an unknown one), and calls that are
no longer needed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import structlog

log = structlog.get_logger(__name__)

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


async def cancel_all(calls: Sequence[asyncio.Future[Any]]) -> None:
    """Cancels `calls` and returns once each has ended (their outcomes are dropped)."""
    for call in calls:
        call.cancel()
    if calls:
        await asyncio.gather(*calls, return_exceptions=True)
