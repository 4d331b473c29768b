"""The simulation's trace: every event that matters (requests served, faults, acknowledgments),
stamped with virtual time, folded into a running digest (two runs of one seed must give the
same digest) and the last few kept for a failure report."""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable


class Trace:
    """Records events; `digest()` identifies the whole sequence, `tail()` shows the last ones."""

    def __init__(self, now: Callable[[], float], *, keep: int = 400) -> None:
        self._now = now
        self._hash = hashlib.blake2b(digest_size=16)
        self._recent: deque[str] = deque(maxlen=keep)
        self.events = 0

    def record(self, kind: str, **fields: object) -> None:
        """Adds one event `kind` with its fields (values are rendered with str)."""
        line = f"{self._now():.6f} {kind}"
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        self._hash.update(line.encode())
        self._recent.append(line)
        self.events += 1

    def digest(self) -> str:
        """Returns the hex digest of every event recorded so far."""
        return self._hash.hexdigest()

    def tail(self, count: int | None = None) -> list[str]:
        """Returns the last `count` events (all kept ones when None), oldest first."""
        recent = list(self._recent)
        return recent if count is None else recent[-count:]
