"""Always-on checks of conditions that must never break, unlike `assert` which `-O` strips."""

from __future__ import annotations

from typing import Any


class InvariantViolation(AssertionError):
    """A condition that must never break did break: a bug, not an operational error.

    Deliberately not a `StreamError`: callers that handle operational errors must not catch it.
    Keyword context is kept in `context` and shown in the message.
    """

    def __init__(self, message: str, **context: Any) -> None:
        self.message = message
        self.context = context
        super().__init__(message)

    def __str__(self) -> str:
        if not self.context:
            return self.message
        ctx = ", ".join(f"{k}={v!r}" for k, v in sorted(self.context.items()))
        return f"{self.message} ({ctx})"


def invariant(condition: object, message: str, **context: Any) -> None:
    """Return None when `condition` is truthy; otherwise raise `InvariantViolation(message,
    **context)`. Runs under `python -O` too."""
    if not condition:
        raise InvariantViolation(message, **context)
