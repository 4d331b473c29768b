"""When GC and compaction run: a GC round every `gc_interval_ms`, a minor compaction every
`compaction_interval_ms` and a major one every `major_compaction_interval_ms`, by the
storage's clock; run by the GC thread, or step by step by a simulator (`run_due`)."""

from __future__ import annotations

import threading

from stream.bookie.storage.gc import CompactionReport, GarbageCollector, GcReport
from stream.bookie.storage.store import Store
from stream.logs import get_logger

log = get_logger(__name__)


class GcSchedule:
    """The GC and compaction rounds over one `Store`; `start()` sets the first due times."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._gc = GarbageCollector(store.index, store.logs, store.index_lock)
        # Clock times of the next GC, minor and major compaction rounds (set by start()).
        self._next_gc = self._next_minor = self._next_major = 0.0

    def start(self) -> None:
        """Schedules the first rounds, one interval each from now."""
        config = self._store.config
        now = self._store.clock()
        self._next_gc = now + config.gc_interval_ms / 1000.0
        self._next_minor = now + config.compaction_interval_ms / 1000.0
        self._next_major = now + config.major_compaction_interval_ms / 1000.0

    def stop(self) -> None:
        """Ends a round under way early (for a shutdown)."""
        self._gc.stop()

    def gc_once(self) -> GcReport:
        """Runs one garbage collection now: drops trimmed entries from the index and deletes
        the entry logs without live entries (never the current one); returns what it did."""
        return self._gc.gc_once(self._trim_points())

    def compact_once(self, threshold: float, kind: str = "manual") -> CompactionReport:
        """Runs one compaction now: rewrites the live entries of logs whose live ratio is
        below `threshold` (0 disables) into the current log and deletes the old logs."""
        return self._gc.compact_once(threshold, self._trim_points(), kind=kind)

    def _trim_points(self) -> dict[int, int]:
        # dict() copies in C (atomic under the GIL) while the event loop may add streams.
        states = dict(self._store.states)
        return {sid: s.first_entry_id for sid, s in states.items() if s.first_entry_id > 0}

    def next_due(self) -> float:
        """Returns the clock time of the next GC or compaction round."""
        return min(self._next_gc, self._next_minor, self._next_major)

    def run_due(self) -> None:
        """Runs the GC and compaction rounds that are due by the clock: the GC thread's
        step. Blocks for the round's length."""
        config = self._store.config
        now = self._store.clock()
        if now >= self._next_major:
            self._next_major = now + config.major_compaction_interval_ms / 1000.0
            self.compact_once(config.major_compaction_threshold, kind="major")
        elif now >= self._next_minor:
            self._next_minor = now + config.compaction_interval_ms / 1000.0
            self.compact_once(config.minor_compaction_threshold, kind="minor")
        if now >= self._next_gc:
            self._next_gc = now + config.gc_interval_ms / 1000.0
            self.gc_once()

    def run(self, stop: threading.Event) -> None:
        """The GC thread's loop, until `stop` is set."""
        while not stop.is_set():
            if stop.wait(max(self.next_due() - self._store.clock(), 0.0)):
                break
            try:
                self.run_due()
            except Exception:
                log.exception("storage.gc_failed")
