"""The write cache: entries not yet flushed to entry logs, kept serialized (the bytes an
entry log stores), per stream in a dict `entry_id -> bytes`.

Bytes, not the protobuf `Entry` objects received: an `Entry` is a container the cyclic GC
tracks, and a second's worth of them (20,000 at 20,000/s) outlived the young generations, so
every few seconds a full collection walked them all and stalled the event loop for 30-85 ms
(measured in the bookie with `gc.callbacks`, `bench paced --rate 15000`). Bytes are not
tracked, a dict holding only ints and bytes is not either, and the flush writes them as they
are instead of serializing each entry on its own thread.

Two exist at a time, as in DbLedgerStorage: the active cache takes adds; at a flush it
becomes the frozen snapshot that the flusher writes out while a new active cache starts. The
flusher iterates a frozen cache from its own thread, so deletions (truncate, trim) replace a
frozen cache's per-stream dict by a filtered copy instead of mutating it.
"""

from __future__ import annotations

from collections.abc import Callable

# Memory counted per cached entry beyond its payload (the bytes object, its entry fields,
# the dict slot and key).
ENTRY_OVERHEAD_BYTES = 128


class WriteCache:
    """Entries of many streams in memory; `bytes` estimates their size."""

    __slots__ = ("streams", "bytes", "frozen")

    def __init__(self) -> None:
        self.streams: dict[int, dict[int, bytes]] = {}
        self.bytes = 0
        self.frozen = False

    def __len__(self) -> int:
        return sum(map(len, self.streams.values()))

    def get(self, stream_id: int, entry_id: int) -> bytes | None:
        """Returns the cached entry (serialized), or None."""
        entries = self.streams.get(stream_id)
        return entries.get(entry_id) if entries is not None else None

    def max_entry_id(self, stream_id: int, at_most: int) -> int:
        """Returns the highest cached entry id of the stream that is <= `at_most`, or -1."""
        entries = self.streams.get(stream_id)
        if not entries:
            return -1
        return max((e for e in entries if e <= at_most), default=-1)

    def drop_above(self, stream_id: int, after_entry_id: int) -> int:
        """Deletes the stream's entries with an id above `after_entry_id`; returns how many."""
        return self._drop(stream_id, lambda entry_id: entry_id > after_entry_id)

    def drop_below(self, stream_id: int, before_entry_id: int) -> int:
        """Deletes the stream's entries with an id below `before_entry_id`; returns how many."""
        return self._drop(stream_id, lambda entry_id: entry_id < before_entry_id)

    def _drop(self, stream_id: int, doomed: Callable[[int], bool]) -> int:
        entries = self.streams.get(stream_id)
        if not entries:
            return 0
        victims = [entry_id for entry_id in entries if doomed(entry_id)]
        if not victims:
            return 0
        if self.frozen:
            victim_set = set(victims)
            self.streams[stream_id] = {k: v for k, v in entries.items() if k not in victim_set}
        else:
            for entry_id in victims:
                del entries[entry_id]
        return len(victims)
