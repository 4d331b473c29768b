"""Waiting in asyncio tests by polling with a deadline, never by a bare sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

TIMEOUT_S = 10.0


async def until(condition: Callable[[], object], timeout_s: float = TIMEOUT_S) -> None:
    """Returns once `condition()` is true; fails the test past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never met"
        await asyncio.sleep(0.01)


async def holds_for(seconds: float, condition: Callable[[], bool]) -> bool:
    """Returns whether `condition` held at every check for `seconds` (a negative check)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not condition():
            return False
        await asyncio.sleep(0.01)
    return condition()
