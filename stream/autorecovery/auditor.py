"""The auditor (docs/design.md §7): finds the fragments that name a lost or draining bookie and
marks them under-replicated; closes, by a takeover, the open last fragment of a stream without a
live writer so that it can be repaired; runs the scrub. One auditor leads at a time (the
election is in `stream.autorecovery.service`); two for a moment only duplicate work, since
marks are idempotent and every metadata change is a CAS.

A bookie is lost once it has been missing from `/bookies/available` for
`lost_bookie_recovery_delay_ms`: the clock starts when the auditor sees it go, or, for a
bookie already gone when the auditor started, when an audit finds a fragment naming it.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stream.autorecovery import metrics
from stream.autorecovery.settings import AutoRecoverySettings
from stream.autorecovery.worker import sealed_last
from stream.client.idle_close import IdleClose, IdleCloser
from stream.client.options import WriterOptions
from stream.client.ports import BookieTransport
from stream.client.recovery import TakeoverResult, WriterIdentity
from stream.client.zk_metadata import ZkMetadata
from stream.clock import Clock, SystemClock
from stream.errors import InvalidTermError, NotEnoughBookiesError, StreamError, StreamNotFoundError
from stream.logs import get_logger
from stream.metadata import Fragment, StreamMeta, StreamSealedError
from stream.metadata.underreplication import Marker, UnderreplicationStore
from stream.protocol import choose_replacement, journal_required
from stream.protocol.rereplication import FragmentView, audit_fragments, replacement_ensemble

log = get_logger(__name__)


@dataclass
class AuditReport:
    """What one audit pass did."""

    streams: int = 0
    marked: int = 0
    open_left_to_writer: int = 0
    open_waiting: int = 0
    takeovers: int = 0
    errors: int = 0
    seconds: float = 0.0
    # Bookies counted lost / draining in this pass.
    bad: dict[str, str] = field(default_factory=dict)


class Auditor:
    """Audit passes over every stream; the caller decides when (see `AutoRecovery`)."""

    def __init__(
        self,
        *,
        metadata: ZkMetadata,
        transport: BookieTransport,
        settings: AutoRecoverySettings,
        identifier: str,
        rng: random.Random | None = None,
        clock: Clock | None = None,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        """`monotonic` overrides `clock.monotonic` (tests that step the delays by hand)."""
        self._metadata = metadata
        self._store = UnderreplicationStore(metadata.session)
        self._transport = transport
        self._settings = settings
        self._rng = rng or random.Random()
        self._clock = clock or SystemClock()
        self._monotonic = monotonic or self._clock.monotonic
        self._closer = IdleCloser(
            transport=transport,
            metadata=metadata,
            clock=self._clock,
            rng=self._rng,
            options=WriterOptions(
                takeover_deadline_s=max(30.0, settings.bookie_timeout_ms / 1000 * 3)
            ),
            identity=WriterIdentity(f"auditor-{identifier}", socket.gethostname(), os.getpid()),
            bookie_timeout_s=settings.bookie_timeout_ms / 1000,
        )
        # Bookies missing from the registry: since when (monotonic).
        self.missing_since: dict[str, float] = {}
        self._last_available: set[str] | None = None
        # Open last fragments naming a bad bookie with no live writer: since when.
        self._open_since: dict[tuple[int, int], float] = {}

    # -- who is lost -----------------------------------------------------------------------

    async def bad_bookies(self) -> dict[str, str]:
        """Returns the bookies whose fragments must be re-replicated now, with the reason:
        lost (missing for the delay) or draining."""
        available = {c.bookie_id for c in await self._metadata.available_bookies()}
        now = self._monotonic()
        if self._last_available is not None:
            for bookie_id in self._last_available - available:
                self.missing_since.setdefault(bookie_id, now)
        for bookie_id in available:
            if self.missing_since.pop(bookie_id, None) is not None:
                log.info("autorecovery.bookie_back", bookie=bookie_id)
        self._last_available = available
        delay_s = self._settings.lost_bookie_recovery_delay_ms / 1000
        bad = {b: "lost" for b, since in self.missing_since.items() if now - since >= delay_s}
        for bookie_id in await asyncio.to_thread(self._store.draining):
            bad.setdefault(bookie_id, "draining")
        return bad

    def next_deadline(self) -> float | None:
        """Returns when (monotonic) a missing bookie turns lost or an open fragment's grace
        ends, whichever is first; None when nothing waits."""
        delay_s = self._settings.lost_bookie_recovery_delay_ms / 1000
        grace_s = self._settings.open_stream_replication_delay_ms / 1000
        now = self._monotonic()
        times = [t + delay_s for t in self.missing_since.values() if t + delay_s > now]
        times += [t + grace_s for t in self._open_since.values()]
        return min(times, default=None)

    # -- one pass --------------------------------------------------------------------------

    async def audit(self, may_continue: Callable[[], bool] = lambda: True) -> AuditReport:
        """Looks at every stream once; returns what it did."""
        started = self._monotonic()
        report = AuditReport(bad=await self.bad_bookies())
        budget = self._settings.max_takeovers_per_audit
        seen_open: set[tuple[int, int]] = set()
        for stream_id in await asyncio.to_thread(self._metadata.store.stream_ids):
            if not may_continue():
                break
            report.streams += 1
            try:
                budget -= await self._audit_stream(stream_id, report, budget, seen_open)
            except StreamNotFoundError:
                continue
            except StreamError as e:
                report.errors += 1
                log.warning("autorecovery.audit_stream_failed", stream_id=stream_id, error=str(e))
        for key in set(self._open_since) - seen_open:
            del self._open_since[key]
        report.seconds = self._monotonic() - started
        metrics.AUDITS.inc()
        metrics.LOST_BOOKIES.set(sum(1 for r in report.bad.values() if r == "lost"))
        log.info(
            "autorecovery.audit",
            streams=report.streams,
            marked=report.marked,
            takeovers=report.takeovers,
            open_left_to_writer=report.open_left_to_writer,
            open_waiting=report.open_waiting,
            bad=report.bad,
            errors=report.errors,
            seconds=round(report.seconds, 3),
        )
        return report

    async def _audit_stream(
        self,
        stream_id: int,
        report: AuditReport,
        budget: int,
        seen_open: set[tuple[int, int]],
    ) -> int:
        """Marks the stream's fixed fragments that name a bad bookie; returns the takeovers
        run (at most `budget`) for its open last fragment."""
        meta, version, fragments = await self._metadata.get_snapshot(stream_id)
        now = self._monotonic()
        available = self._last_available or set()
        for fragment in fragments:
            for bookie_id in fragment.ensemble:
                if bookie_id not in available:
                    # Gone before this auditor started: its delay starts now.
                    self.missing_since.setdefault(bookie_id, now)
        bad = report.bad
        if not bad:
            return 0
        findings = audit_fragments(
            [FragmentView(f.first_entry_id, f.ensemble, f.last_entry_id) for f in fragments],
            bad,
            first_retained=meta.first_entry_id,
            sealed_last=sealed_last(meta),
        )
        used = 0
        for finding in findings:
            if finding.fixed:
                reason = "lost" if any(bad[b] == "lost" for b in finding.bookies) else "draining"
                marker = Marker(
                    meta.id, finding.first_entry_id, finding.bookies, reason, self._clock.now_ms()
                )
                if await asyncio.to_thread(self._store.mark, marker):
                    report.marked += 1
                    metrics.MARKED.labels(reason=reason).inc()
                continue
            key = (meta.id, finding.first_entry_id)
            if await asyncio.to_thread(self._metadata.store.writer_alive, meta.id):
                report.open_left_to_writer += 1  # its ensemble change replaces the bookie
                continue
            seen_open.add(key)
            since = self._open_since.setdefault(key, now)
            if now - since < self._settings.open_stream_replication_delay_ms / 1000:
                report.open_waiting += 1
                continue
            if used >= budget:
                continue
            # Look again just before (as retention does): a writer that came since the
            # snapshot (a new one, or one whose session came back) must not be fenced by us.
            if not await self._still_writerless(meta.id, version):
                report.open_left_to_writer += 1
                continue
            used += 1
            if await self._close_open_tail(meta, fragments[finding.index], set(bad)):
                report.takeovers += 1
                metrics.TAKEOVERS.inc()
                self._open_since.pop(key, None)
                seen_open.discard(key)
                # Its fragments are fixed now: mark them in this pass.
                await self._audit_stream(stream_id, report, 0, seen_open)
        return used

    async def _still_writerless(self, stream_id: int, version: int) -> bool:
        """Returns whether the stream's meta is still at the audited `version` and no writer
        holds the stream."""
        store = self._metadata.store
        _, current = await asyncio.to_thread(store.get_stream_by_id, stream_id)
        return current == version and not await asyncio.to_thread(store.writer_alive, stream_id)

    async def _close_open_tail(self, meta: StreamMeta, last: Fragment, bad: set[str]) -> bool:
        """Takes over a stream whose open last fragment names a bad bookie and has no live
        writer: the recovery fixes its end (a lost bookie that misses the no-op is replaced
        by the recovery itself); a last fragment that still names a bad bookie (a draining
        one takes recovery adds) is closed at the no-op and followed by an empty fragment
        without it. Returns whether the stream moved on."""
        log.info(
            "autorecovery.takeover",
            stream=meta.name,
            stream_id=meta.id,
            first_entry_id=last.first_entry_id,
            term=meta.term + 1,
        )

        async def without_bad(result: TakeoverResult) -> Sequence[str] | None:
            if not any(b in bad for b in result.last_fragment.ensemble):
                return None
            return await self._replacement_ensemble(result, bad)

        try:
            outcome = await self._closer.take_over_and_close(meta.name, next_ensemble=without_bad)
        except (StreamSealedError, InvalidTermError) as e:
            log.info("autorecovery.takeover_yielded", stream=meta.name, reason=str(e))
            return False
        except NotEnoughBookiesError as e:
            log.warning("autorecovery.no_replacement", stream=meta.name, error=str(e))
            return False
        except StreamError as e:
            log.warning("autorecovery.takeover_failed", stream=meta.name, error=str(e))
            return False
        # EMPTY: an empty last fragment still naming a bad bookie; the next writer's first add
        # moves it.
        return outcome in (IdleClose.CLOSED, IdleClose.KEPT)

    async def _replacement_ensemble(self, result: TakeoverResult, bad: set[str]) -> Sequence[str]:
        """Returns the last fragment's ensemble with each bad bookie replaced; raises
        NotEnoughBookiesError."""
        current = result.last_fragment
        candidates = await self._metadata.available_bookies()
        replacements: dict[str, str] = {}
        for bookie_id in current.ensemble:
            if bookie_id in bad:
                replacements[bookie_id] = choose_replacement(
                    current.ensemble,
                    current.ensemble.index(bookie_id),
                    candidates,
                    self._rng,
                    exclude={*bad, *replacements.values()},
                    needs_journal=journal_required(result.meta.ack_quorum),
                )
        return replacement_ensemble(current.ensemble, replacements)
