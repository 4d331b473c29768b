"""The history of a chaos run: JSON lines, one file per process (workers and the harness), each
event stamped with `time.monotonic()` (one clock for every process of the machine, network
namespaces included)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

# Event types.
OPEN = "open"  # a writer's takeover finished: term
INVOKE = "invoke"  # an append was called: payload
ACK = "ack"  # an append was acknowledged: payload, entry id, term
FAIL = "fail"  # an append failed: payload, error (the entry may or may not be written)
READ = "read"  # a reader got entry e with payload v, in segment seg (contiguous coverage)
FAULT = "fault"  # the nemesis applied a fault: name, details
HEAL = "heal"  # the nemesis healed every fault
TERM_FIXED = "term-fixed"  # a term's recovery fixed the end: term, first entry id
TRIM = "trim"  # retention trimmed below entry e
SEAL = "seal"  # the stream was sealed
ERROR = "error"  # anything else that went wrong in a process: op, error


class HistoryWriter:
    """Appends events of one process to its file (flushed per event: a process may be
    killed). Thread-safe: appends complete on the client's thread."""

    def __init__(self, path: Path, process: str) -> None:
        self.process = process
        self._file: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()

    def record(self, kind: str, **fields: Any) -> None:
        with self._lock:
            event = {"t": time.monotonic(), "p": self.process, "type": kind, **fields}
            if not self._file.closed:
                self._file.write(json.dumps(event, separators=(",", ":")) + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


def load(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Returns the events of every file, ordered by time (a line cut by a kill is skipped)."""
    events: list[dict[str, Any]] = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    events.sort(key=lambda event: event["t"])
    return events
