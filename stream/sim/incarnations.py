"""A stream deleted and created again under its name (BUGGIFY `recreate`): the new incarnation
has a new id (ids are never handed out twice, `stream.metadata.stream_creates`), while the old
one's writers, readers and the entries its bookies still hold (until a `Trim` or their
reconciler drops them) may be around. The new incarnation is judged by every property of
docs/design.md §10 on its own, and by one more:

- `no-resurrection`: a reader of the new incarnation (the final read included) returns only
  what was appended to it, never an entry appended to an older incarnation of the name.

The simulator notes which incarnation each payload was appended to (`Origins.appended`, by the
checker judging that incarnation: an id handed out twice must not hide a resurrection);
payloads are unique within a run (each client numbers its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from stream.sim.checker import Checker
from stream.sim.trace import Trace

NO_RESURRECTION = "no-resurrection"


class Origins:
    """The incarnation (the checker judging it) each payload of a stream was appended to."""

    def __init__(self) -> None:
        self._origin: dict[bytes, Checker] = {}

    def appended(self, incarnation: Checker, payloads: Iterable[bytes]) -> None:
        """Notes `payloads` as appended to the incarnation `incarnation` judges."""
        for payload in payloads:
            self._origin.setdefault(payload, incarnation)

    def origin(self, payload: bytes) -> Checker | None:
        """Returns the checker of the incarnation `payload` was appended to (None: unknown)."""
        return self._origin.get(payload)


class IncarnationChecker(Checker):
    """The checker of a re-created stream: the base properties, and no resurrection of an
    older incarnation's entries in what its readers return."""

    def __init__(
        self,
        trace: Trace,
        now: Callable[[], float],
        *,
        stream: str,
        origins: Origins,
    ) -> None:
        super().__init__(trace, now, stream=stream)
        self._origins = origins

    def on_read(
        self, reader: str, first: int, last: int, entries: Iterable[tuple[int, bytes]]
    ) -> None:
        got = list(entries)
        super().on_read(reader, first, last, got)
        self._judge(f"reader {reader}", got)

    def final(
        self, end_entry_id: int, final_read: Mapping[int, bytes] | None, *, source: str = ""
    ) -> None:
        super().final(end_entry_id, final_read, source=source)
        if final_read is not None and not self.deleted:
            self._judge(source or "the final read", final_read.items())

    def _judge(self, who: str, entries: Iterable[tuple[int, bytes]]) -> None:
        """Reports the first entry of `entries` appended to another incarnation."""
        for entry_id, payload in entries:
            origin = self._origins.origin(payload)
            if origin is not None and origin is not self:
                self.violate(
                    NO_RESURRECTION,
                    f"{who} returned entry {entry_id} ({payload!r}); it was appended to an "
                    "older, deleted incarnation of the stream",
                )
                return
