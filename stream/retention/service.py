"""The retention service (docs/design.md §6): leader-elected, periodic, bounded work per round.

One instance leads at a time, elected with kazoo's `Lock` recipe under `/retention` (the
others wait on the lock). Each round the leader, for a bounded number of streams:
1. plans what the stream's policy drops (`stream.retention.policy`, pure);
2. CAS-deletes those fragment znodes and moves the first retained entry id forward (one
   multi-op of at most `MAX_OPS_PER_MULTI - 1` deletions, checking the meta version);
3. tells the deleted fragments' bookies to `Trim` below the new first entry. A bookie that
   misses the message trims anyway: its reconciler (`stream.bookie.reconcile`) compares with
   metadata every GC interval;
With `keep_unconsumed` in a stream's policy, step 1 reads the stream's durable cursors: the
age limit spares what some cursor has not consumed, `max_bytes` still bounds it. With
`export_cursor_lag`, every stream's cursors are read each round and their lag behind the LAC
(asked of the last fragment's bookies) is set on Prometheus gauges (`stream.retention.metrics`).

4. for a stream with no live writer whose open last fragment is past the age limit
   (apache/pulsar#9057), runs a takeover, closes that fragment at the takeover's no-op and
   opens an empty one on the same bookies, so the data fragment can go at step 1-3.

What a round costs: the stream ids, each stream's meta, the fragment names of streams with a
policy, and fragment contents only where the policy looks (`stream.retention.fragments`);
closed fragments are remembered between rounds, so a stream's steady cost is its new fragments.
Bounds: `max_streams_per_round`, `max_fragments_per_round`, `max_takeovers_per_round`, a
timeout on every bookie request, a deadline on every takeover.

Leadership is an efficiency matter, not a safety one: every metadata change is a CAS and a
bookie trim never goes above metadata's first retained entry, so two leaders for a moment (a
session lost while a round runs) only duplicate work. The leader stops leading when its
ZooKeeper session is lost and contends again on the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from stream.client.cursor import cursor_lags
from stream.client.grpc_transport import GrpcTransport
from stream.client.idle_close import IdleClose, IdleCloser
from stream.client.options import WriterOptions
from stream.client.ports import BookieTransport
from stream.client.reader import AsyncStreamReader
from stream.client.recovery import TakeoverResult, WriterIdentity
from stream.client.timestamps import read_timestamp, timestamp_in_write_set
from stream.client.zk_metadata import ZkMetadata
from stream.clock import Clock, SystemClock
from stream.errors import (
    InvalidArgumentError,
    InvalidTermError,
    MetadataError,
    StreamError,
    StreamNotFoundError,
)
from stream.logs import get_logger
from stream.metadata import (
    MAX_OPS_PER_MULTI,
    BadVersionError,
    Fragment,
    MetadataSession,
    MetadataSessionExpiredError,
    StreamMeta,
    StreamSealedError,
    StreamState,
)
from stream.metadata.election import LeaderElection
from stream.protocol import Code
from stream.retention import metrics
from stream.retention.fragments import FragmentWindow, StaleFragments, read_fragments
from stream.retention.policy import IdleAction, idle_action, idle_candidate, plan_retention
from stream.security.tls import TLSConfig
from stream.settings import NON_NEGATIVE, POSITIVE, Settings, setting
from stream.wakeup import wake

log = get_logger(__name__)

T = TypeVar("T")

# Under the metadata root, beside /streams and /bookies (docs/design.md §3 lists `/retention`).
ELECTION_PATH = "/retention/leader"
# Deletions per trim multi-op: one op of the multi-op rewrites `meta`.
_DELETES_PER_CAS = MAX_OPS_PER_MULTI - 1
# Rereads of a stream whose meta version moved under a trim (a writer rolled meanwhile).
_CAS_ATTEMPTS = 4
_TRIM_OK = (int(Code.OK), int(Code.NO_SUCH_STREAM))


@dataclass(frozen=True)
class RetentionSettings(Settings):
    """How often the service runs and how much one round may do (every bound it keeps)."""

    interval_s: float = setting(60.0, unit="s", check=POSITIVE, doc="time between rounds")
    max_streams_per_round: int = setting(
        1000,
        check=POSITIVE,
        doc="streams looked at per round; the next round continues where this one stopped",
    )
    max_fragments_per_round: int = setting(
        10_000, check=POSITIVE, doc="fragment znodes deleted per round, over all streams"
    )
    max_takeovers_per_round: int = setting(
        4,
        check=NON_NEGATIVE,
        doc="idle-stream takeovers per round (each is a recovery: fences, reads, writes a no-op)",
    )
    takeover_retry_s: float = setting(
        300.0,
        unit="s",
        check=POSITIVE,
        doc="a stream whose idle takeover failed is left alone this long",
    )
    # Their retention fields never change, so a round reads only new fragments.
    max_remembered_fragments: int = setting(
        200_000,
        check=POSITIVE,
        doc="closed fragments remembered between rounds; beyond this many, streams are read afresh",
    )
    bookie_timeout_s: float = setting(
        5.0,
        unit="s",
        check=POSITIVE,
        doc="timeout of each Trim / StreamState / Read request to a bookie",
    )
    takeover_deadline_s: float = setting(
        30.0,
        unit="s",
        check=POSITIVE,
        doc="a takeover gives up after this long (retried next time the stream comes up)",
    )
    # Costs, per stream with cursors, its fragment znodes and one ReadLac to the last
    # fragment's bookies.
    export_cursor_lag: bool = setting(
        False, doc="set each durable cursor's lag on the Prometheus gauges every round"
    )


@dataclass
class RoundReport:
    """What one round did."""

    streams_checked: int = 0
    fragments_deleted: int = 0
    # Recorded sizes of the deleted fragments (unknown sizes count 0).
    bytes_deleted: int = 0
    trims_sent: int = 0
    trims_failed: int = 0
    idle_takeovers: int = 0
    errors: int = 0
    # Fragment znodes read (closed fragments are remembered between rounds).
    fragments_read: int = 0
    # Streams whose first retained entry moved: stream id -> new first entry id.
    trimmed: dict[int, int] = field(default_factory=dict)
    # Idle streams whose last fragment's bookies were asked: stream id -> the decision.
    idle: dict[int, IdleAction] = field(default_factory=dict)


@dataclass
class _Budget:
    fragments: int
    takeovers: int


class RetentionService:
    """The retention service on one metadata session (not owned: close it yourself). `run()`
    blocks, contending for leadership and running rounds while leader, until `stop()`;
    `run_once()` runs one round now without the election (operators, tests)."""

    def __init__(
        self,
        session: MetadataSession,
        settings: RetentionSettings | None = None,
        *,
        identifier: str | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        writer_options: WriterOptions | None = None,
        transport_factory: Callable[[ZkMetadata], BookieTransport] | None = None,
        tls: TLSConfig | None = None,
        metadata: ZkMetadata | None = None,
    ) -> None:
        """`transport_factory` builds the bookie transport on the service's event loop
        (default: gRPC to the registered bookie addresses, over TLS with `tls`'s files when
        given). `metadata` is the metadata port on `session` (default: a `ZkMetadata`)."""
        self.settings = settings or RetentionSettings()
        self.identifier = identifier or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        self._session = session
        self._metadata = metadata or ZkMetadata(session)
        self._store = self._metadata.store
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._writer_options = dataclasses.replace(
            writer_options or WriterOptions(),
            takeover_deadline_s=self.settings.takeover_deadline_s,
        )
        self._transport_factory = transport_factory or (
            lambda metadata: GrpcTransport(metadata.bookie_address, tls=tls)
        )
        self._transport: BookieTransport | None = None
        # Next stream id to look at: rounds walk the ids in order, wrapping around.
        self._cursor = 0
        self._takeover_retry_at: dict[int, float] = {}
        # Closed fragments read in earlier rounds, per stream id (see FragmentWindow).
        self._remembered: dict[int, dict[int, Fragment]] = {}
        self._remembered_count = 0
        # Label sets of the lag gauges set, per stream id (removed when the cursor goes).
        self._lag_labels: dict[int, set[tuple[str, str]]] = {}
        self._stopping = False
        self._election = LeaderElection(
            session,
            ELECTION_PATH,
            self.identifier,
            events="retention",
            rng=random.Random(self._rng.getrandbits(64)),
            on_change=self._wake_up,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self.rounds = 0
        self.last_report: RoundReport | None = None

    # ------------------------------------------------------------------ public

    @property
    def is_leader(self) -> bool:
        """Returns whether this instance leads now (holds the lock on its current session)."""
        return self._election.leading and not self._stopping

    def run(self) -> None:
        """Contends for leadership and runs a round every `interval_s` while leading, until
        `stop()`; survives ZooKeeper outages and session losses (contends again)."""
        try:
            asyncio.run(self.serve())
        finally:
            self.close()

    def run_once(self) -> RoundReport:
        """Runs one round now, without the election, and returns what it did."""
        return asyncio.run(self.run_once_async())

    async def run_once_async(self) -> RoundReport:
        """`run_once` on the running event loop (not beside `serve()`: it has the transport)."""
        self._transport = self._transport_factory(self._metadata)
        try:
            return await self.run_round()
        finally:
            await self._close_transport()

    def close(self) -> None:
        """Releases the service's worker threads (`run()` does it when it returns); the
        metadata session stays open (it is not the service's)."""
        self._election.close()
        self._metadata.close()

    def stop(self) -> None:
        """Makes `run()` return soon: a pending election is cancelled, a leader releases the
        lock after the stream it is working on. Thread-safe and idempotent."""
        self._stopping = True
        self._election.cancel()
        self._wake_up()

    # ------------------------------------------------------------------ election

    def _wake_up(self) -> None:
        wake(self._loop, self._wake)

    async def serve(self) -> None:
        """`run()` on the running event loop (it returns after `stop()`); `close()` is the
        caller's."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._transport = self._transport_factory(self._metadata)
        log.info("retention.started", id=self.identifier, interval_s=self.settings.interval_s)
        try:
            while not self._stopping:
                if not await self._election.campaign():
                    continue
                try:
                    if not self._stopping:
                        log.info(
                            "retention.elected",
                            id=self.identifier,
                            session=self._session.session_id_hex,
                        )
                        await self._lead()
                finally:
                    await self._election.resign()
                    log.info("retention.leadership_released", id=self.identifier)
        finally:
            await self._close_transport()
            log.info("retention.stopped", id=self.identifier, rounds=self.rounds)

    async def _lead(self) -> None:
        """Runs rounds every `interval_s` while this instance leads."""
        while self.is_leader:
            if not await self._election.holds():
                log.warning(
                    "retention.leadership_lost", reason="lock node gone", id=self.identifier
                )
                return
            started = self._clock.monotonic()
            try:
                await self.run_round()
            except Exception:  # the service must outlive any one round's failure
                log.exception("retention.round_failed", id=self.identifier)
            elapsed = self._clock.monotonic() - started
            await self._pause(max(self.settings.interval_s - elapsed, 0.0))

    async def _pause(self, seconds: float) -> None:
        """Returns after `seconds`, or earlier on stop() or a session change."""
        event = self._wake
        if event is None:
            await self._clock.sleep(seconds)
            return
        event.clear()
        # A wake-up that came just before the clear() is seen here instead.
        if self._stopping or (self._election.node is not None and not self.is_leader):
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), seconds)

    async def _close_transport(self) -> None:
        transport, self._transport = self._transport, None
        close = getattr(transport, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()

    # ------------------------------------------------------------------ one round

    def _leadership_check(self) -> Callable[[], bool]:
        """Returns a check that the round may go on: still leading (when elected) and not
        stopping. A round run by `run_once` has no leadership to lose."""
        elected = self._election.leading

        def may_continue() -> bool:
            return not self._stopping and (not elected or self.is_leader)

        return may_continue

    async def run_round(self) -> RoundReport:
        """Runs one round over at most `max_streams_per_round` streams, from where the last
        round stopped; returns what it did."""
        settings = self.settings
        report = RoundReport()
        budget = _Budget(settings.max_fragments_per_round, settings.max_takeovers_per_round)
        may_continue = self._leadership_check()
        started = self._clock.monotonic()
        try:
            ids = await asyncio.to_thread(self._store.stream_ids)
        except MetadataError as e:
            log.warning("retention.round_skipped", error=str(e))
            report.errors += 1
            return self._finish_round(report, started)
        present = set(ids)
        for gone in [s for s in self._remembered if s not in present]:
            self._forget(gone)
        for gone in [s for s in self._lag_labels if s not in present]:
            self._drop_lag_gauges(gone, set())
        # This round: the ids from the cursor on, then from the start (wrapping around).
        ordered = [i for i in ids if i >= self._cursor] + [i for i in ids if i < self._cursor]
        for stream_id in ordered[: settings.max_streams_per_round]:
            if not may_continue() or budget.fragments <= 0:
                break
            self._cursor = stream_id + 1
            report.streams_checked += 1
            try:
                await self._retain(stream_id, report, budget)
                if settings.export_cursor_lag:
                    await self._export_lag(stream_id)
            except StreamNotFoundError:
                self._drop_lag_gauges(stream_id, set())
                self._forget(stream_id)
                continue  # deleted meanwhile
            except MetadataSessionExpiredError as e:
                log.warning("retention.session_expired", stream_id=stream_id, error=str(e))
                report.errors += 1
                break
            except StreamError as e:
                log.warning("retention.stream_failed", stream_id=stream_id, error=str(e))
                report.errors += 1
        else:
            if len(ordered) <= settings.max_streams_per_round:
                self._cursor = 0
        return self._finish_round(report, started)

    def _finish_round(self, report: RoundReport, started: float) -> RoundReport:
        self.rounds += 1
        self.last_report = report
        log.info(
            "retention.round",
            streams=report.streams_checked,
            fragments_deleted=report.fragments_deleted,
            bytes_deleted=report.bytes_deleted,
            trims_sent=report.trims_sent,
            trims_failed=report.trims_failed,
            idle_takeovers=report.idle_takeovers,
            errors=report.errors,
            fragments_read=report.fragments_read,
            seconds=round(self._clock.monotonic() - started, 3),
        )
        return report

    async def _read(self, stream_id: int) -> tuple[StreamMeta, int, FragmentWindow]:
        """Returns the stream's meta, version and fragments (fetched lazily, consistent with
        that version: meta is read first)."""
        meta, version = await asyncio.to_thread(self._store.get_stream_by_id, stream_id)
        fragments = await asyncio.to_thread(
            read_fragments, self._session, stream_id, self._remembered.get(stream_id)
        )
        return meta, version, fragments

    def _forget(self, stream_id: int) -> None:
        self._remembered_count -= len(self._remembered.pop(stream_id, {}))

    def _remember(self, stream_id: int, fragments: FragmentWindow) -> None:
        """Keeps the stream's closed fragments for the next round, within the bound."""
        self._forget(stream_id)
        known = fragments.closed_known()
        if known and self._remembered_count + len(known) <= self.settings.max_remembered_fragments:
            self._remembered[stream_id] = known
            self._remembered_count += len(known)

    async def _retain(self, stream_id: int, report: RoundReport, budget: _Budget) -> None:
        """Applies the stream's policy: deletes what it drops and, for an idle stream, closes
        an expired last fragment so that it can be dropped too."""
        meta, version = await asyncio.to_thread(self._store.get_stream_by_id, stream_id)
        policy = meta.retention
        if policy is None or (policy.max_age_s is None and policy.max_bytes is None):
            self._forget(stream_id)
            return  # nothing to read further: most streams keep everything
        positions = await self._cursor_positions(stream_id) if policy.keep_unconsumed else []
        fragments = await asyncio.to_thread(
            read_fragments, self._session, stream_id, self._remembered.get(stream_id)
        )
        try:
            meta, version, fragments = await self._delete_planned(
                meta, version, fragments, report, budget, positions
            )
            if (
                budget.takeovers > 0
                and fragments
                and await self._close_idle(meta, version, fragments, report, budget)
            ):
                report.fragments_read += fragments.reads
                meta, version, fragments = await self._read(stream_id)
                meta, version, fragments = await self._delete_planned(
                    meta, version, fragments, report, budget, positions
                )
        finally:
            report.fragments_read += fragments.reads
        self._remember(stream_id, fragments)

    async def _cursor_positions(self, stream_id: int) -> list[int]:
        """Returns the positions of the stream's durable cursors (what they have consumed)."""
        cursors = await asyncio.to_thread(self._metadata.cursors.list, stream_id)
        return [p.entry_id for p in cursors.values()]

    async def _delete_planned(
        self,
        meta: StreamMeta,
        version: int,
        fragments: FragmentWindow,
        report: RoundReport,
        budget: _Budget,
        cursor_positions: Sequence[int] = (),
    ) -> tuple[StreamMeta, int, FragmentWindow]:
        """Deletes the fragments the policy drops (sparing those the cursors at
        `cursor_positions` need, when it keeps unconsumed ones), in multi-ops of at most
        `_DELETES_PER_CAS` within the round's budget, and tells their bookies to trim; returns
        the stream as it stands afterwards."""
        attempts = 0
        while budget.fragments > 0:
            try:
                plan = await asyncio.to_thread(
                    plan_retention,
                    fragments,
                    meta.retention,
                    self._clock.now_ms(),
                    cursor_positions,
                )
                if plan.held_by_cursors:
                    log.info(
                        "retention.held_by_cursors",
                        stream=meta.name,
                        fragments=plan.held_by_cursors,
                    )
                if plan.empty:
                    break
                count = min(plan.delete_count, _DELETES_PER_CAS, budget.fragments)
                # The deleted fragments are read for their bookies (to send them Trim). A
                # remembered one may name the bookies from before a re-replication: the new
                # holder then trims through its reconciler instead.
                doomed: list[Fragment] = await asyncio.to_thread(list, fragments[:count])
                new_first = max(fragments.first_entry_ids[count], meta.first_entry_id)
                meta, version = await asyncio.to_thread(
                    self._store.trim_fragments,
                    meta.id,
                    version,
                    [f.first_entry_id for f in doomed],
                    new_first,
                )
            except (BadVersionError, InvalidArgumentError, StaleFragments) as e:
                # A writer rolled or a client trimmed meanwhile: look again (bounded).
                attempts += 1
                if attempts >= _CAS_ATTEMPTS:
                    log.info("retention.trim_conflicts", stream=meta.name, error=str(e))
                    break
                report.fragments_read += fragments.reads
                meta, version, fragments = await self._read(meta.id)
                continue
            # Our CAS was the change: the kept fragments are the rest of our window.
            fragments = fragments[count:]
            budget.fragments -= count
            report.fragments_deleted += count
            report.bytes_deleted += sum(f.bytes or 0 for f in doomed)
            report.trimmed[meta.id] = new_first
            log.info(
                "retention.trimmed",
                stream=meta.name,
                stream_id=meta.id,
                fragments=count,
                first_entry_id=new_first,
                by_age=plan.by_age,
                by_size=plan.by_size,
            )
            await self._trim_bookies(meta, doomed, new_first, report)
        return meta, version, fragments

    async def _trim_bookies(
        self, meta: StreamMeta, doomed: Sequence[Fragment], before: int, report: RoundReport
    ) -> None:
        """Sends `Trim(before)` to every bookie of the deleted fragments, in parallel, best
        effort: a bookie that misses it trims when its reconciler next compares with
        metadata."""
        transport = self._transport
        if transport is None:
            return
        bookies = sorted({b for f in doomed for b in f.ensemble})
        timeout_s = self.settings.bookie_timeout_s

        async def one(bookie_id: str) -> bool:
            try:
                response = await asyncio.wait_for(
                    transport.trim(bookie_id, meta.id, before, timeout_s=timeout_s), timeout_s
                )
            except Exception as e:  # unknown answer: the bookie's reconciler catches up
                log.info("retention.trim_not_delivered", bookie=bookie_id, error=repr(e))
                return False
            if response.code not in _TRIM_OK:
                log.info("retention.trim_refused", bookie=bookie_id, code=Code(response.code).name)
                return False
            return True

        results = await asyncio.gather(*(one(b) for b in bookies))
        report.trims_sent += sum(results)
        report.trims_failed += len(results) - sum(results)

    # ------------------------------------------------------------------ cursor lag

    async def _export_lag(self, stream_id: int) -> None:
        """Sets the lag gauges of the stream's cursors (and drops those of deleted ones)."""
        names = await asyncio.to_thread(self._metadata.cursors.names, stream_id)
        if not names or self._transport is None:
            self._drop_lag_gauges(stream_id, set())
            return
        meta, _ = await asyncio.to_thread(self._store.get_stream_by_id, stream_id)
        reader = AsyncStreamReader(
            meta.name, transport=self._transport, metadata=self._metadata, rng=self._rng
        )
        await reader.open()
        lags = await cursor_lags(self._metadata, reader, await reader.lac())
        labels = set()
        for cursor, lag in lags.items():
            labels.add((meta.name, cursor))
            metrics.CURSOR_LAG_ENTRIES.labels(meta.name, cursor).set(lag.entries)
            if lag.bytes is not None:
                metrics.CURSOR_LAG_BYTES.labels(meta.name, cursor).set(lag.bytes)
        self._drop_lag_gauges(stream_id, labels)

    def _drop_lag_gauges(self, stream_id: int, kept: set[tuple[str, str]]) -> None:
        """Removes the stream's lag gauges other than `kept`, and remembers `kept`."""
        for labels in self._lag_labels.pop(stream_id, set()) - kept:
            for gauge in metrics.LAG_GAUGES:
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
        if kept:
            self._lag_labels[stream_id] = kept

    # ------------------------------------------------------------------ idle streams

    async def _close_idle(
        self,
        meta: StreamMeta,
        version: int,
        fragments: FragmentWindow,
        report: RoundReport,
        budget: _Budget,
    ) -> bool:
        """Returns whether it closed the stream's last fragment by a takeover: only when no
        writer is live and the fragment holds entries past the age limit."""
        last = await asyncio.to_thread(lambda: fragments[-1])
        now_ms = self._clock.now_ms()
        if meta.state is StreamState.SEALED or not idle_candidate(last, meta.retention, now_ms):
            return False
        retry_at = self._takeover_retry_at.get(meta.id)
        if retry_at is not None and self._clock.monotonic() < retry_at:
            return False
        if await asyncio.to_thread(self._store.writer_alive, meta.id):
            return False
        highest, newest_ts = await self._probe_last_fragment(meta, last)
        action = idle_action(
            last, meta.retention, now_ms, highest_entry_id=highest, newest_timestamp_ms=newest_ts
        )
        report.idle[meta.id] = action
        log.debug("retention.idle_probe", stream=meta.name, action=action.value, highest=highest)
        if action is not IdleAction.TAKE_OVER:
            return False
        # Re-check just before: a writer that came meanwhile must not be fenced by us.
        current, current_version = await asyncio.to_thread(self._store.get_stream_by_id, meta.id)
        if current_version != version or await asyncio.to_thread(self._store.writer_alive, meta.id):
            return False
        budget.takeovers -= 1
        try:
            closed = await self._take_over_and_close(current, newest_ts)
        except (StreamSealedError, InvalidTermError) as e:
            log.info("retention.idle_takeover_yielded", stream=meta.name, reason=str(e))
            return False
        except StreamError as e:
            self._takeover_retry_at[meta.id] = (
                self._clock.monotonic() + self.settings.takeover_retry_s
            )
            log.warning("retention.idle_takeover_failed", stream=meta.name, error=str(e))
            report.errors += 1
            return False
        self._takeover_retry_at.pop(meta.id, None)
        report.idle_takeovers += 1
        return closed

    async def _probe_last_fragment(
        self, meta: StreamMeta, last: Fragment
    ) -> tuple[int | None, int | None]:
        """Returns (highest entry id the last fragment's bookies hold, that entry's timestamp).
        The id is -1 when EC of them say they hold nothing there, None when too few answered;
        the timestamp is None when the entry could not be read."""
        transport = self._transport
        if transport is None:
            return None, None
        timeout_s = self.settings.bookie_timeout_s

        async def state(bookie_id: str) -> Any:
            try:
                return await asyncio.wait_for(
                    transport.stream_state(bookie_id, meta.id, timeout_s=timeout_s), timeout_s
                )
            except Exception as e:  # unknown answer
                log.debug("retention.probe_failed", bookie=bookie_id, error=repr(e))
                return None

        answers = await asyncio.gather(*(state(b) for b in last.ensemble))
        held: list[tuple[int, str]] = []
        answered = 0
        for bookie_id, answer in zip(last.ensemble, answers, strict=True):
            if answer is None:
                continue
            if answer.code == Code.OK:
                answered += 1
                held.append((answer.last_entry_id, bookie_id))
            elif answer.code == Code.NO_SUCH_STREAM:
                answered += 1
                held.append((-1, bookie_id))
        highest, holder = max(held, default=(-1, ""))
        if highest < last.first_entry_id:
            # "Nothing here" needs EC answers: fewer could miss an entry on the silent ones.
            coverage = meta.ensemble - meta.ack_quorum + 1
            return (-1 if answered >= coverage else None), None
        return highest, await read_timestamp(transport, meta.id, holder, highest, timeout_s)

    async def _take_over_and_close(self, meta: StreamMeta, newest_ts: int | None) -> bool:
        """Takes the stream over (new term; the recovery ends with the truncate no-op), then
        closes the last fragment at the no-op and opens an empty one on the same bookies
        (they were in the fragment just before: no new-member truncation needed). Returns
        whether the data fragment is closed."""
        transport = self._transport
        if transport is None:
            return False
        identity = WriterIdentity(f"retention-{self.identifier}", socket.gethostname(), os.getpid())
        log.info("retention.idle_takeover", stream=meta.name, stream_id=meta.id, term=meta.term + 1)
        timeout_s = self.settings.bookie_timeout_s

        async def same_bookies(result: TakeoverResult) -> Sequence[str]:
            return result.last_fragment.ensemble

        async def newest_real_entry(result: TakeoverResult) -> int | None:
            # The fragment's newest real entry ages it (the no-op is stamped now).
            current = result.last_fragment
            if result.last_entry_id - 1 < current.first_entry_id:
                return newest_ts
            stamp = await timestamp_in_write_set(
                transport,
                meta.id,
                meta.quorum,
                current.ensemble,
                result.last_entry_id - 1,
                timeout_s,
            )
            return stamp if stamp is not None else newest_ts

        closer = IdleCloser(
            transport=transport,
            metadata=self._metadata,
            clock=self._clock,
            rng=self._rng,
            options=self._writer_options,
            identity=identity,
            bookie_timeout_s=timeout_s,
        )
        outcome = await closer.take_over_and_close(
            meta.name, next_ensemble=same_bookies, last_timestamp=newest_real_entry
        )
        if outcome is IdleClose.YIELDED:
            return False  # a writer took over meanwhile: the stream is its own
        # EMPTY: the recovery itself moved to a fresh fragment after the no-op.
        log.info("retention.idle_closed", stream=meta.name, outcome=outcome.value)
        return True
