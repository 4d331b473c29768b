"""One chaos run: start the cluster, the workloads and the retention service, apply the seeded
schedule of faults while the harness watches the terms and the trims, heal, let the writers show
progress, seal, read everything back, and check the history."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream.client import StreamClient
from stream.errors import StreamError
from stream.logs import get_logger
from stream.metadata.connection import MetadataSession
from stream.metadata.streams import StreamStore
from stream.sandbox.chaos import history
from stream.sandbox.chaos.checker import FINAL, FINAL_READER, Verdict, check
from stream.sandbox.chaos.cluster import BOOKIES, RETENTION, STREAM, WRITERS, ChaosCluster
from stream.sandbox.chaos.history import HistoryWriter
from stream.sandbox.chaos.nemesis import FAULTS, Nemesis, Step, schedule
from stream.sandbox.netns import netem_available

log = get_logger(__name__)

# How often the harness looks at the stream's term history and first retained entry.
_WATCH_S = 0.2


# What delays packets in a run with delay faults: the kernel's netem where it has it, else the
# relays (stream.sandbox.chaos.relay).
DELAY_BY_NETEM = "tc netem"
DELAY_BY_RELAY = "userspace relay (this kernel has no sch_netem)"


@dataclass
class ChaosResult:
    seed: int
    steps: list[Step]
    verdict: Verdict
    duration_s: float
    history_dir: Path
    events: list[dict[str, Any]]
    delay_by: str | None = None  # None: no delay fault in the schedule

    def delay_line(self) -> str:
        return f"delay faults by: {self.delay_by or 'none drawn'}"


class _Watcher(threading.Thread):
    """Records each term's first entry id once the metadata shows it (its recovery fixed the
    end), and each trim the retention service made (the first retained entry moving)."""

    def __init__(self, metadata: str, record: HistoryWriter) -> None:
        super().__init__(name="chaos-watcher", daemon=True)
        self.stop = threading.Event()
        self._metadata, self._record = metadata, record
        self._seen: set[int] = set()
        self._first_retained = 0

    def run(self) -> None:
        session = MetadataSession.connect(self._metadata, timeout_s=30.0)
        store = StreamStore(session)
        try:
            while not self.stop.wait(_WATCH_S):
                self._watch(store)
        finally:
            session.close()

    def _watch(self, store: StreamStore) -> None:
        try:
            meta, _ = store.get_stream(STREAM)
        except StreamError:
            return  # ZooKeeper unreachable for now: try again
        for term, first in meta.term_history:
            if term not in self._seen:
                self._seen.add(term)
                self._record.record(history.TERM_FIXED, term=term, first=first)
        if meta.first_entry_id > self._first_retained:
            self._first_retained = meta.first_entry_id
            self._record.record(history.TRIM, e=meta.first_entry_id)


def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise StreamError(f"chaos: {what} did not happen in time", timeout_s=timeout_s)
        time.sleep(0.2)


def _acks_so_far(cluster: ChaosCluster) -> int:
    return sum(1 for e in history.load(cluster.history_files()) if e["type"] == history.ACK)


def run_chaos(
    data_dir: Path,
    *,
    seed: int,
    duration_s: float,
    progress_bound_s: float = 30.0,
    faults: tuple[str, ...] = tuple(FAULTS),
    steps: list[Step] | None = None,
    without_protections: tuple[str, ...] = (),
    on_step: Callable[[str], None] = lambda line: None,
    **cluster_options: Any,
) -> ChaosResult:
    """Runs the whole thing and returns the schedule and the checker's verdict: the schedule
    drawn from `seed` over `faults` for `duration_s`, or the given `steps`. `on_step` gets one
    line per step as it is applied (the benchmark prints them)."""
    started = time.monotonic()
    if steps is None:
        steps = schedule(
            seed,
            duration_s,
            bookies=cluster_options.get("bookies", BOOKIES),
            writers=cluster_options.get("writers", WRITERS),
            netem=True,  # the relays stand in where the kernel has no netem
            faults=faults,
        )
    delay_by = None
    if any(step.fault == "delay" for step in steps):
        delay_by = DELAY_BY_NETEM if netem_available() else DELAY_BY_RELAY
    cluster = ChaosCluster(
        data_dir, seed=seed, without_protections=without_protections,
        delay_relays=delay_by == DELAY_BY_RELAY, **cluster_options,
    )  # fmt: skip
    with cluster:
        record = cluster.harness_history
        assert record is not None
        client = StreamClient.connect(cluster.metadata, timeout_s=30.0)
        watcher = _Watcher(cluster.metadata, record)
        try:
            client.create_stream(STREAM, ensemble=3, write_quorum=3, ack_quorum=2,
                                 fragment_max_entries=200, retention=RETENTION)  # fmt: skip
            cluster.start_workers()
            _wait_for(lambda: _acks_so_far(cluster) > 0, 60, "a first acknowledgment")
            watcher.start()
            nemesis = Nemesis(cluster)
            for step in steps:
                time.sleep(step.quiet_s)  # the schedule's own pacing, not a wait for a state
                on_step(str(step))
                record.record(history.FAULT, name=step.fault, target=step.target)
                heal = nemesis.apply(step)
                time.sleep(step.hold_s)
                heal()
                record.record(history.HEAL)
            # Quiet: the writers must show progress within the bound.
            time.sleep(progress_bound_s)
            cluster.stop_workers()
            watcher.stop.set()
            watcher.join()
            _final_read(client, record, cluster.history_dir / "final.jsonl")
        finally:
            watcher.stop.set()
            client.close()
        events = history.load(cluster.history_files())
    verdict = check(events, progress_bound_s=progress_bound_s)
    return ChaosResult(
        seed, steps, verdict, time.monotonic() - started, cluster.history_dir, events, delay_by
    )


def _final_read(client: StreamClient, record: HistoryWriter, path: Path) -> None:
    """Seals the stream (a last recovery) and reads every retained entry, as FINAL_READER."""
    client.seal_stream(STREAM)
    record.record(history.SEAL)
    info = client.stream_info(STREAM)
    final = HistoryWriter(path, FINAL_READER)
    try:
        reader = client.open_reader(STREAM)
        if info.lac >= info.first_entry_id:
            for entry in reader.read(info.first_entry_id, info.lac):
                final.record(history.READ, seg=0, e=entry.entry_id, v=entry.payload.decode())
        final.record(FINAL, first=info.first_entry_id, last=info.lac)
    finally:
        final.close()
