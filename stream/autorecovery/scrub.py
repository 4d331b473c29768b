"""The scrub (docs/design.md §7): does each live bookie hold the entries metadata assigns to it?

Cheap pass: the first and the last id of each bookie's share of each fixed fragment (a bookie
that lost a whole stream or a fragment's tail shows there). Full pass, on a slower schedule:
every id of the share read back with its checksum. A bookie that answers "no such entry" (an
explicit negative), or returns an entry whose checksum does not match, gets the fragment
marked with reason `scrub`, and a worker replaces it like a lost one. Unknown answers (limbo,
timeouts) and trimmed ranges are not findings.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from stream.autorecovery import metrics
from stream.autorecovery.worker import sealed_last
from stream.client.ports import BookieTransport
from stream.client.zk_metadata import ZkMetadata
from stream.clock import Clock, SystemClock
from stream.errors import StreamError, StreamNotFoundError
from stream.framing.verify import checksum_ok, good_run
from stream.logs import get_logger
from stream.metadata import Fragment, StreamMeta
from stream.metadata.underreplication import Marker, UnderreplicationStore
from stream.protocol import ResponseClass, classify
from stream.protocol.rereplication import (
    FragmentView,
    fragment_bounds,
    share_ends,
    share_runs,
)

log = get_logger(__name__)

_READ_BATCH_BYTES = 1 << 20


@dataclass
class ScrubReport:
    full: bool
    fragments: int = 0
    checked_entries: int = 0
    marked: int = 0
    errors: int = 0


class Scrubber:
    """One scrub pass over every stream (run by the leading auditor)."""

    def __init__(
        self,
        *,
        metadata: ZkMetadata,
        transport: BookieTransport,
        timeout_s: float,
        clock: Clock | None = None,
    ) -> None:
        self._metadata = metadata
        self._store = UnderreplicationStore(metadata.session)
        self._transport = transport
        self._timeout_s = timeout_s
        self._clock = clock or SystemClock()

    async def scrub(
        self, *, full: bool, may_continue: Callable[[], bool] = lambda: True
    ) -> ScrubReport:
        report = ScrubReport(full=full)
        available = {c.bookie_id for c in await self._metadata.available_bookies()}
        for stream_id in await asyncio.to_thread(self._metadata.store.stream_ids):
            if not may_continue():
                break
            try:
                meta, _, fragments = await self._metadata.get_snapshot(stream_id)
            except StreamNotFoundError:
                continue
            except StreamError as e:
                report.errors += 1
                log.warning("autorecovery.scrub_stream_failed", stream_id=stream_id, error=str(e))
                continue
            views = [FragmentView(f.first_entry_id, f.ensemble, f.last_entry_id) for f in fragments]
            for i, fragment in enumerate(fragments):
                bounds = fragment_bounds(
                    views, i, first_retained=meta.first_entry_id, sealed_last=sealed_last(meta)
                )
                if bounds is None or bounds[1] < bounds[0]:
                    continue
                report.fragments += 1
                await self._scrub_fragment(meta, fragment, bounds, available, full, report)
        log.info(
            "autorecovery.scrub",
            full=full,
            fragments=report.fragments,
            checked_entries=report.checked_entries,
            marked=report.marked,
            errors=report.errors,
        )
        return report

    async def _scrub_fragment(
        self,
        meta: StreamMeta,
        fragment: Fragment,
        bounds: tuple[int, int],
        available: set[str],
        full: bool,
        report: ScrubReport,
    ) -> None:
        first, last = bounds
        short: list[str] = []
        for index, bookie_id in enumerate(fragment.ensemble):
            if bookie_id not in available:
                continue  # the audit's business
            if full:
                ok = await self._holds_runs(
                    meta, bookie_id, share_runs(meta.quorum, index, first, last), report
                )
            else:
                ok = await self._holds_ids(
                    meta, bookie_id, share_ends(meta.quorum, index, first, last), report
                )
            if not ok:
                short.append(bookie_id)
        if short:
            marker = Marker(
                meta.id, fragment.first_entry_id, tuple(short), "scrub", self._clock.now_ms()
            )
            log.warning(
                "autorecovery.scrub_found",
                stream=meta.name,
                first_entry_id=fragment.first_entry_id,
                bookies=short,
            )
            if await asyncio.to_thread(self._store.mark, marker):
                report.marked += 1
                metrics.MARKED.labels(reason="scrub").inc()

    async def _holds_ids(
        self, meta: StreamMeta, bookie_id: str, ids: list[int], report: ScrubReport
    ) -> bool:
        """Returns False when the bookie says it lacks one of `ids` or returns it damaged."""
        for entry_id in ids:
            try:
                response = await self._transport.read(
                    bookie_id, meta.id, entry_id, timeout_s=self._timeout_s
                )
            except Exception as e:  # unknown
                log.debug("autorecovery.scrub_read_failed", bookie=bookie_id, error=repr(e))
                continue
            report.checked_entries += 1
            outcome = classify(response.code)
            if outcome is ResponseClass.EXPLICIT_NEGATIVE:
                return False
            if outcome is ResponseClass.POSITIVE and (
                response.entry.entry_id != entry_id or not checksum_ok(meta.id, response.entry)
            ):
                return False
        return True

    async def _holds_runs(
        self,
        meta: StreamMeta,
        bookie_id: str,
        runs: Iterator[tuple[int, int]],
        report: ScrubReport,
    ) -> bool:
        """Returns False when the bookie lacks an id of `runs` or returns one damaged."""
        for a, b in runs:
            position = a
            try:
                async for response in self._transport.read_range(
                    bookie_id,
                    meta.id,
                    a,
                    b,
                    max_batch_bytes=_READ_BATCH_BYTES,
                    timeout_s=max(self._timeout_s, 60.0),
                ):
                    if good_run(meta.id, position, response.entries) != len(response.entries):
                        return False
                    position += len(response.entries)
                    report.checked_entries += len(response.entries)
                    outcome = classify(response.code)
                    if outcome is ResponseClass.EXPLICIT_NEGATIVE:
                        return False
                    if outcome is not ResponseClass.POSITIVE:
                        break  # unknown (limbo, trimmed meanwhile): no finding
            except Exception as e:  # unknown
                log.debug("autorecovery.scrub_read_failed", bookie=bookie_id, error=repr(e))
        return True
