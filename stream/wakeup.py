"""Waking a coroutine that waits on an `asyncio.Event` from another thread (a kazoo watch, a
session listener, `stop()` from the caller's thread): the services' one way of doing it."""

from __future__ import annotations

import asyncio
import contextlib


def wake(loop: asyncio.AbstractEventLoop | None, event: asyncio.Event | None) -> None:
    """Sets `event` on `loop`, from any thread; does nothing before both exist or once the loop
    closed (the service stopped meanwhile)."""
    if loop is not None and event is not None and not loop.is_closed():
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(event.set)
