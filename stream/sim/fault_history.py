"""The run's fault history: when each link, node, bookie and client session was faulted, as
spans of virtual time. The needless-give-up property (`stream.sim.checker`) asks it whether a
spare bookie was usable by a writer for the whole of an ensemble change; nothing here acts.

A span opens when a fault starts (with the end it was given, when it has one) and is cut short
when the fault is lifted earlier (a restore, a release, the run's heal). The history only ever
errs toward "faulted": a fault it cannot see end stays open, which makes the property judge
less, never wrongly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

# A link's faults (keyed (kind, src, dst)): dropped, held, slowed, its Add stream or unary
# messages held.
LINK_FAULTS = ("cut", "clog", "slow", "hold_adds", "hold_unary")
# A node's own pause (keyed ("pause", node)).
PAUSE = "pause"
# A bookie's faults (keyed (kind, bookie)): down, published read-only, absent from the
# registrations (its session closed or expired).
BOOKIE_FAULTS = ("down", "read_only", "unregistered")
# A client's metadata faults (keyed (kind, client)): its session expired, a reply armed to be
# lost.
CLIENT_FAULTS = ("session", "lost_reply")

Key = tuple[str, ...]


class FaultHistory:
    """Spans `[start, end]` of virtual time during which each fault held."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._spans: dict[Key, list[list[float]]] = {}

    def start(self, *key: str, duration_s: float = math.inf) -> None:
        """Opens a span of fault `key` now, for `duration_s` (inf: until `end`)."""
        now = self._now()
        self._spans.setdefault(key, []).append([now, now + duration_s])

    def end(self, *key: str) -> None:
        """Ends every span of fault `key` still running now."""
        now = self._now()
        for span in self._spans.get(key, ()):
            span[1] = min(span[1], now)

    def end_all(self, kinds: Iterable[str]) -> None:
        """Ends every running span of the faults of `kinds` (the run's heal)."""
        wanted = set(kinds)
        for key in self._spans:
            if key[0] in wanted:
                self.end(*key)

    def clear(self, key: Key, start_s: float, end_s: float) -> bool:
        """Returns whether fault `key` held at no instant of `[start_s, end_s]`."""
        return all(
            span_end < start_s or span_start > end_s
            for span_start, span_end in self._spans.get(key, ())
        )

    def link_clear(self, a: str, b: str, start_s: float, end_s: float) -> bool:
        """Returns whether the links between nodes `a` and `b` (both ways) and both nodes
        themselves were unfaulted for the whole of `[start_s, end_s]`."""
        keys: list[Key] = [
            (kind, src, dst) for kind in LINK_FAULTS for src, dst in ((a, b), (b, a))
        ]
        keys += [(PAUSE, a), (PAUSE, b)]
        return all(self.clear(key, start_s, end_s) for key in keys)

    def bookie_clear(self, bookie_id: str, start_s: float, end_s: float) -> bool:
        """Returns whether `bookie_id` was up, writable and registered for the whole of
        `[start_s, end_s]`."""
        return all(self.clear((kind, bookie_id), start_s, end_s) for kind in BOOKIE_FAULTS)

    def client_clear(self, name: str, start_s: float, end_s: float) -> bool:
        """Returns whether client `name`'s metadata session was unfaulted (not expired, no
        reply armed to be lost) for the whole of `[start_s, end_s]`."""
        return all(self.clear((kind, name), start_s, end_s) for kind in CLIENT_FAULTS)
