"""A bookie's reconciliation with metadata (docs/design.md §6): every GC interval, for the streams
this bookie holds, read each stream's first retained entry id from ZooKeeper and trim the local copy
below it; a stream deleted from metadata is trimmed away entirely. So a bookie that was down
(or unreachable) when the retention service or a client sent `Trim` still lets go of the data,
and its GC and compaction then return the disk space.

Only metadata's word deletes: a stream counts as deleted when its `meta` znode is gone AND its
id was handed out (below the `/streams/next-id` counter; ids are never reused). A stream id the
metadata never knew (a test or tool that wrote to the bookie directly) is left alone, and so is
every stream when ZooKeeper cannot be read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import NoNodeError

from stream.clock import Clock, SystemClock
from stream.errors import MetadataError, StreamError
from stream.logs import get_logger
from stream.metadata import paths
from stream.metadata.connection import MetadataSession
from stream.metadata.model import StreamMeta

log = get_logger(__name__)

# Trim point of a stream deleted from metadata: everything goes.
TRIM_ALL = (1 << 63) - 1
_OK = 1  # pb.OK; the storage's codes are the wire protocol's


@dataclass(frozen=True)
class ReconcileReport:
    """What one reconciliation round did."""

    streams_checked: int
    streams_trimmed: int
    streams_deleted: int
    skipped: bool = False  # ZooKeeper could not be read: nothing was touched


class MetadataReconciler:
    """Trims `storage` (a bookie's `StreamStorage`) to what metadata retains. Runs on the
    bookie's event loop (storage calls belong to that thread); ZooKeeper reads go to a worker
    thread."""

    def __init__(
        self,
        storage: Any,
        session: MetadataSession,
        *,
        interval_s: float,
        max_streams_per_round: int = 10_000,
        clock: Clock | None = None,
        on_round: Callable[[ReconcileReport], None] | None = None,
    ) -> None:
        """`on_round` is told what each round of `run_forever` did (the simulator's trace)."""
        self._clock = clock or SystemClock()
        self._on_round = on_round
        self._storage = storage
        self._session = session
        self._interval_s = interval_s
        self._max_streams = max_streams_per_round
        # Rounds walk the held stream ids in order from here, wrapping around.
        self._cursor = 0

    async def run_forever(self) -> None:
        """Reconciles now, then every `interval_s`, until cancelled; a failed round is logged
        and the next one runs on schedule."""
        while True:
            try:
                report = await self.reconcile_once()
                if self._on_round is not None:
                    self._on_round(report)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one bad round stop reconciliation for good
                log.exception("reconcile.failed")
            await self._clock.sleep(self._interval_s)

    def _candidates(self) -> list[tuple[int, int]]:
        """Returns `(stream_id, local first retained entry)` of the held streams to look at
        this round (not yet trimmed away), at most `max_streams_per_round`, from the cursor."""
        held = []
        for stream_id in sorted(self._storage.stream_ids()):
            state = self._storage.stream_state(stream_id)
            if state is not None and state.first_entry_id < TRIM_ALL:
                held.append((stream_id, state.first_entry_id))
        ordered = [h for h in held if h[0] >= self._cursor] + [
            h for h in held if h[0] < self._cursor
        ]
        chosen = ordered[: self._max_streams]
        self._cursor = chosen[-1][0] + 1 if len(ordered) > len(chosen) else 0
        return chosen

    async def reconcile_once(self) -> ReconcileReport:
        """Runs one round: trims every held stream below metadata's first retained entry (or
        entirely when metadata deleted it); returns what it did."""
        candidates = self._candidates()
        if not candidates:
            return ReconcileReport(0, 0, 0)
        started = self._clock.monotonic()
        try:
            targets = await asyncio.to_thread(self._read_targets, [s for s, _ in candidates])
        except StreamError as e:
            log.info("reconcile.metadata_unavailable", error=str(e))
            return ReconcileReport(len(candidates), 0, 0, skipped=True)
        trimmed = deleted = 0
        waits = []
        for stream_id, local_first in candidates:
            target = targets.get(stream_id)
            if target is None or target <= local_first:
                continue
            outcome = self._storage.trim(stream_id, target)
            if outcome.code != _OK:
                log.warning("reconcile.trim_failed", stream_id=stream_id, message=outcome.message)
                continue
            if outcome.durable is not None:
                waits.append(asyncio.wrap_future(outcome.durable))
            if target == TRIM_ALL:
                deleted += 1
            else:
                trimmed += 1
            log.info(
                "reconcile.trimmed",
                stream_id=stream_id,
                before_entry_id=target,
                deleted=target == TRIM_ALL,
            )
        # The journal's fsync of the trims; GC drops the entries and their logs later.
        for result in await asyncio.gather(*waits, return_exceptions=True):
            if isinstance(result, BaseException):
                log.warning("reconcile.trim_not_durable", error=repr(result))
        if trimmed or deleted:
            log.info(
                "reconcile.done",
                streams=len(candidates),
                trimmed=trimmed,
                deleted=deleted,
                seconds=round(self._clock.monotonic() - started, 3),
            )
        return ReconcileReport(len(candidates), trimmed, deleted)

    def _read_targets(self, stream_ids: list[int]) -> dict[int, int]:
        """Returns the trim point metadata gives each of `stream_ids` (its first retained
        entry, or `TRIM_ALL` once deleted); streams it cannot tell about are left out. Runs
        on a worker thread; raises `MetadataError` when ZooKeeper does not answer."""
        zk = self._session.zk

        def read_all() -> tuple[bytes, dict[int, Any]]:
            counter = zk.get_async(paths.STREAMS_NEXT_ID)
            # Pipelined: one round trip's latency for the whole batch.
            pending = {s: zk.get_async(paths.stream_meta(s)) for s in stream_ids}
            return counter.get()[0], pending

        counter, pending = self._session.retry(read_all)
        try:
            next_id = int(counter.decode())
        except (UnicodeDecodeError, ValueError) as exc:
            raise MetadataError("malformed stream id counter", path=paths.STREAMS_NEXT_ID) from exc
        targets: dict[int, int] = {}
        for stream_id, result in pending.items():
            try:
                data = result.get()[0]
            except NoNodeError:
                if stream_id < next_id:
                    targets[stream_id] = TRIM_ALL  # created once, deleted since
                continue
            except Exception as e:  # this one is unknown this round
                log.debug("reconcile.read_failed", stream_id=stream_id, error=repr(e))
                continue
            try:
                targets[stream_id] = StreamMeta.from_json(data).first_entry_id
            except MetadataError:
                log.warning("reconcile.meta_malformed", stream_id=stream_id)
        return targets
