"""Fixtures for the simulator's tests: structlog set up as simulations need it (the client's
warnings dropped, its errors turned into violations) for each module, then restored."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from stream.sim.runner import sim_logging


@pytest.fixture(autouse=True, scope="module")
def _sim_logging() -> Iterator[None]:
    saved = structlog.get_config()
    sim_logging()
    try:
        yield
    finally:
        structlog.configure(**saved)
