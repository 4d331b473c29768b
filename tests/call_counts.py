"""Counts the calls every client of the test's process makes to some async methods (metadata
reads, LAC reads), by name: for tests of what a call skips."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest


def count_calls(monkeypatch: pytest.MonkeyPatch, *targets: tuple[type, str]) -> Counter[str]:
    """Wraps each `(class, async method name)` of `targets` for the test (monkeypatch undoes
    it); returns the counter its calls add to, keyed by method name."""
    counted: Counter[str] = Counter()
    for cls, name in targets:
        original = getattr(cls, name)

        async def counting(
            self: Any, *args: Any, _name: str = name, _f: Any = original, **kwargs: Any
        ) -> Any:
            counted[_name] += 1
            return await _f(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, counting)
    return counted
