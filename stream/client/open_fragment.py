"""What the writer knows of the fragment it appends to: its size and first and last timestamps
(what a capacity roll records when it closes the fragment), and when it is full."""

from __future__ import annotations

import bisect

from stream.client.ports import WallClock
from stream.metadata.model import Fragment, StreamMeta


class OpenFragment:
    """The writer's open fragment. Replaced whole when a takeover, an ensemble change or a roll
    starts another; the drain updates the counters as it adds entries."""

    __slots__ = ("fragment", "bytes", "first_ts", "first_known", "last_ts")

    def __init__(
        self,
        fragment: Fragment,
        *,
        payload_bytes: int = 0,
        first_ts: int | None = None,
        first_known: bool = True,
        last_ts: int | None = None,
    ) -> None:
        self.fragment = fragment
        self.bytes = payload_bytes  # payload bytes written into it (as far as this writer knows)
        self.first_ts = first_ts  # its first entry's timestamp; None while empty (or unknown)
        # False when the fragment held entries of an earlier term whose first timestamp the
        # takeover could not read: the roll then records none (a later guess would claim the
        # fragment starts later than it does, and mislead `seek_time`).
        self.first_known = first_known
        self.last_ts = last_ts

    def room(
        self,
        prefix_bytes: list[int],
        pending_bytes: int,
        next_entry_id: int,
        meta: StreamMeta,
        clock: WallClock,
    ) -> int:
        """Returns how many of the next `len(prefix_bytes) - 1` entries fit (`prefix_bytes[i]`:
        payload bytes of the first `i`; `pending_bytes`: added by this drain, not yet counted;
        `next_entry_id`: the first one's id). A fragment holding entries is full once it
        reached `fragment_max_entries`, `fragment_max_bytes` or `fragment_max_age_s`."""
        count = len(prefix_bytes) - 1
        entries = next_entry_id - self.fragment.first_entry_id
        if self.too_old(meta, clock):
            fits = 0
        else:
            bytes_left = meta.fragment_max_bytes - self.bytes - pending_bytes
            by_bytes = bisect.bisect_left(prefix_bytes, bytes_left, 0, count)
            fits = min(count, max(meta.fragment_max_entries - entries, 0), by_bytes)
        # An empty fragment is never full: its first entry always goes in.
        return max(fits, min(count, 1 - entries))

    def too_old(self, meta: StreamMeta, clock: WallClock) -> bool:
        """Returns whether its first entry is `fragment_max_age_s` old."""
        max_age_s = meta.fragment_max_age_s
        first_ts = self.first_ts
        if max_age_s is None or first_ts is None:
            return False
        return clock.now_ms() - first_ts >= max_age_s * 1000

    def closed_at(self, last_entry_id: int, ensemble: tuple[str, ...]) -> Fragment:
        """Returns the fragment as a roll closes it: at `last_entry_id`, on `ensemble`."""
        fragment = self.fragment
        return Fragment(
            fragment.first_entry_id,
            ensemble,
            created_ms=fragment.created_ms,
            last_entry_id=last_entry_id,
            bytes=self.bytes,
            first_timestamp_ms=self.first_ts if self.first_known else None,
            last_timestamp_ms=self.last_ts,
        )
