"""The add pipeline: entries to their write sets on one Add stream per bookie, batched, with the
acknowledgment bookkeeping of `stream.protocol.PendingAdds` (LAC, LAFR, pinned bookies, what an
ensemble change resends). Shared by the writer (normal adds) and the recovery (write-backs).

It decides nothing about failures: a failed bookie (error, non-OK code, timeout) is reported to
the owner, which plans the ensemble change (with `stream.protocol.plan_ensemble_change`) and
applies it here with `apply_change`. Runs on the event loop thread only.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import operator
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from stream.client.options import WriterOptions
from stream.client.ports import (
    AddBatch,
    AddStream,
    BookieTransport,
    answered_codes,
    answered_ids,
)
from stream.framing.prepare import PreparedEntry
from stream.logs import get_logger
from stream.protocol import (
    Code,
    EnsembleChange,
    FragmentEnsemble,
    PendingAdds,
    QuorumConfig,
    invariant,
)
from stream.wire import bookie_pb2 as pb

log = get_logger(__name__)

_OK = int(Code.OK)
_INVALID_TERM = int(Code.INVALID_TERM)
_TOO_BUSY = int(Code.TOO_BUSY)
_TRIMMED = int(Code.TRIMMED)
# Backoff after a TOO_BUSY answer: doubles from the first value up to the second.
_BUSY_BACKOFF_S = (0.005, 0.5)
_framed = operator.attrgetter("framed")
_payload_bytes = operator.attrgetter("payload_bytes")


class PipelineOwner(Protocol):
    """What the pipeline tells its owner (all called on the loop thread)."""

    def on_acknowledged(self, entry_ids: range) -> None:
        """`entry_ids` (in order) reached AQ with every lower id: the LAC moved."""
        ...

    def on_fully_replicated(self) -> None:
        """LAFR moved: held entries were released (room for more adds)."""
        ...

    def on_bookie_failed(self, bookie_id: str, reason: str) -> None:
        """`bookie_id` failed an add (error, timeout or non-OK code); its later acks are
        ignored until an ensemble change replaces it."""
        ...

    def on_invalid_term(self, bookie_id: str, bookie_term: int) -> None:
        """`bookie_id` answered INVALID_TERM: a newer term exists."""
        ...

    def on_trimmed(self, bookie_id: str, message: str) -> None:
        """`bookie_id` answered TRIMMED: the entries are below the stream's first retained
        entry there (the stream was trimmed past them, or deleted). The bookie is fine and
        no replacement would help: the owner must stop."""
        ...

    def on_error(self, error: Exception) -> None:
        """Processing an answer raised `error` (a bug): the owner must stop."""
        ...


class _Link:
    """The pipeline's side of one bookie: its Add stream, what waits to be sent, and the send
    times of the batches in flight (answered in order)."""

    __slots__ = (
        "bookie_id",
        "stream",
        "outbox",
        "inflight",
        "blocked",
        "dead",
        "lac_sent",
        "lafr_sent",
        "busy_since",
        "busy_backoff_s",
        "busy_timer",
        "last_sent",
        "linger_timer",
    )

    def __init__(self, bookie_id: str, stream: AddStream, blocked: bool) -> None:
        self.bookie_id = bookie_id
        self.stream = stream
        self.outbox: deque[PreparedEntry] = deque()
        self.inflight: deque[float] = deque()
        # A replacement receives nothing until the owner committed the change (unblock).
        self.blocked = blocked
        self.dead = False
        self.lac_sent = -1
        self.lafr_sent = -1
        # TOO_BUSY backpressure: when it started, the current backoff, the pending resend.
        self.busy_since: float | None = None
        self.busy_backoff_s = 0.0
        self.busy_timer: asyncio.TimerHandle | None = None
        # When the last batch of entries was sent, and the timer that sends the next one once
        # `batch_linger_s` passed since.
        self.last_sent = float("-inf")
        self.linger_timer: asyncio.TimerHandle | None = None


class AddPipeline:
    """Adds entries of one stream and term to their write sets and tracks their acks.

    `fixed_lac` (recovery) is carried as the LAC on every add instead of the live one, and the
    LAFR stays the starting `last_entry_id`: a recovery's acks count under its local, not yet
    committed ensemble, and a LAFR published from them could make the next takeover skip an
    entry that the committed ensemble's write set does not hold yet.
    """

    def __init__(
        self,
        *,
        transport: BookieTransport,
        owner: PipelineOwner,
        stream_id: int,
        term: int,
        config: QuorumConfig,
        fragments: Sequence[FragmentEnsemble],
        last_entry_id: int,
        options: WriterOptions,
        max_in_flight: int,
        recovery: bool = False,
        fixed_lac: int | None = None,
    ) -> None:
        self._transport = transport
        self._owner = owner
        self.stream_id = stream_id
        self.term = term
        self.config = config
        self._options = options
        self._recovery = recovery
        self._fixed_lac = fixed_lac
        self._fixed_lafr = None if fixed_lac is None else last_entry_id
        self._loop = asyncio.get_running_loop()
        self.pending: PendingAdds[str] = PendingAdds(
            config, max_in_flight=max_in_flight, last_entry_id=last_entry_id
        )
        self.held: dict[int, PreparedEntry] = {}
        self.held_bytes = 0
        self.fragments: list[FragmentEnsemble] = [FragmentEnsemble(*f) for f in fragments]
        self.failed: set[str] = set()
        # Bookies replaced after failing: not chosen as a replacement again while others can
        # be (BookKeeper's quarantine). A frozen one would otherwise come straight back.
        self.quarantined: set[str] = set()
        # Bookies replaced away by a change the metadata does not hold yet: the stored open
        # fragment still names them, so recovery reads still count their copies, and they
        # must not come back as a replacement (its new-member truncation would strip those
        # copies: an explicit "no entry" can then end a committed entry).
        self.unstored_away: set[str] = set()
        self._links: dict[str, _Link] = {}
        self._write_sets: tuple[tuple[str, ...], ...] = ()
        self._progress = asyncio.Event()  # set whenever LAFR moves
        self._lac_timer: asyncio.TimerHandle | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._last_batch: AddBatch | None = None
        self.closed = False
        self._set_ensemble(self.fragments[-1].ensemble, blocked=(), reopen_failed=True)

    # ------------------------------------------------------------------ views

    @property
    def ensemble(self) -> tuple[str, ...]:
        """Returns the current (last local fragment's) ensemble."""
        return self.fragments[-1].ensemble

    @property
    def lac(self) -> int:
        return self.pending.lac

    @property
    def lafr(self) -> int:
        return self.pending.lafr

    @property
    def next_entry_id(self) -> int:
        return self.pending.next_entry_id

    def write_set(self, entry_id: int) -> tuple[str, ...]:
        """Returns the current write set (bookie ids) of a new entry `entry_id`."""
        return self._write_sets[entry_id % self.config.ensemble]

    def has_room(self) -> bool:
        """Returns whether one more entry fits (entries and payload bytes held, both
        bounded)."""
        return self.pending.has_room() and self.held_bytes < self._options.window_bytes

    def room_for(self, prefix_bytes: list[int]) -> int:
        """Returns how many of the next `len(prefix_bytes) - 1` entries fit, `prefix_bytes[i]`
        being the payload bytes of the first `i` of them: the first `i` before which
        `has_room()` would not hold, as if they were added one by one."""
        count = len(prefix_bytes) - 1
        by_bytes = bisect.bisect_left(
            prefix_bytes, self._options.window_bytes - self.held_bytes, 0, count
        )
        return max(min(count, self.pending.room(), by_bytes), 0)

    def held_payload_bytes(self, from_entry_id: int) -> int:
        """Returns the payload bytes of the held entries with id >= `from_entry_id`."""
        return sum(e.payload_bytes for i, e in self.held.items() if i >= from_entry_id)

    # ------------------------------------------------------------------ adding

    def add(self, entry: PreparedEntry) -> None:
        """Tracks `entry` (its id must be `next_entry_id`) and queues it to its write set;
        call `flush()` after a run of adds."""
        entry_id = entry.entry_id
        write_set = self._write_sets[entry_id % self.config.ensemble]
        self.pending.add(entry_id, write_set)
        self.held[entry_id] = entry
        self.held_bytes += entry.payload_bytes
        links = self._links
        for bookie_id in write_set:
            links[bookie_id].outbox.append(entry)

    def add_run(self, entries: list[PreparedEntry]) -> None:
        """Tracks and queues `entries` (consecutive ids from `next_entry_id`): the same as
        `add` for each in turn, with C-level loops (one outbox extend per bookie when every
        write set is the whole ensemble)."""
        if not entries:
            return
        first = entries[0].entry_id
        end = first + len(entries)
        invariant(entries[-1].entry_id == end - 1, "a run has consecutive ids", first=first)
        write_sets = self._write_sets
        start = first % len(write_sets)
        rotated = write_sets[start:] + write_sets[:start]
        sets = list(itertools.islice(itertools.cycle(rotated), len(entries)))
        self.pending.add_run(first, sets)
        self.held.update(zip(range(first, end), entries, strict=True))
        self.held_bytes += sum(map(_payload_bytes, entries))
        links = self._links
        if self.config.ensemble == self.config.write_quorum:
            for bookie_id in write_sets[0]:
                links[bookie_id].outbox.extend(entries)
        else:
            for entry, write_set in zip(entries, sets, strict=True):
                for bookie_id in write_set:
                    links[bookie_id].outbox.append(entry)

    def send_extra(self, bookie_id: str, entry: PreparedEntry) -> asyncio.Future[pb.AddResponse]:
        """Sends `entry` to `bookie_id` outside its write set (the truncate no-op goes to the
        whole ensemble) and returns the answer's future; not tracked by `pending`."""
        link = self._links[bookie_id]
        invariant(not link.blocked, "extra send to a blocked bookie", bookie=bookie_id)
        return link.stream.send(self._batch([entry]))

    def flush(self) -> None:
        """Sends what waits in every outbox, within each bookie's in-flight bound."""
        for link in self._links.values():
            if link.outbox and not link.blocked and not link.dead:
                self._flush_link(link)

    def _flush_link(self, link: _Link) -> None:
        if link.busy_timer is not None:
            return  # backing off after TOO_BUSY; the timer flushes
        linger = self._options.batch_linger_s
        max_inflight = self._options.inflight_batches_per_bookie
        max_entries = self._options.batch_max_entries
        max_bytes = self._options.batch_max_bytes
        pipelined_min = self._options.pipelined_batch_min_entries
        outbox = link.outbox
        if link.linger_timer is not None:
            if len(outbox) < pipelined_min:
                return  # lingering; the timer flushes
            link.linger_timer.cancel()  # a full batch does not wait
            link.linger_timer = None
        inflight = link.inflight
        while outbox:
            small = len(outbox) < pipelined_min
            # Beside a batch in flight, a small one goes out only once the linger has passed
            # (without a linger: not at all, it waits for the answer). Waiting for the answer
            # instead would add a slow round trip to the next batch's own: the tail of the
            # latency would be two round trips.
            if inflight and (len(inflight) >= max_inflight or (small and not linger)):
                return
            if linger and small:
                wait = link.last_sent + linger - self._loop.time()
                if wait > 0:
                    link.linger_timer = self._loop.call_later(wait, self._end_linger, link)
                    return
            if len(outbox) <= max_entries:
                entries: list[PreparedEntry] = list(outbox)
                outbox.clear()
                size = sum(map(len, map(_framed, entries)))
                if size > max_bytes and len(entries) > 1:
                    # Rare: keep the tail for the next batch.
                    kept: list[PreparedEntry] = []
                    size = 0
                    for e in entries:
                        if kept and size + len(e.framed) > max_bytes:
                            break
                        kept.append(e)
                        size += len(e.framed)
                    outbox.extendleft(reversed(entries[len(kept) :]))
                    entries = kept
            else:
                entries, size = [], 0
                while outbox and len(entries) < max_entries:
                    e = outbox[0]
                    if entries and size + len(e.framed) > max_bytes:
                        break
                    entries.append(outbox.popleft())
                    size += len(e.framed)
            self._send(link, entries)

    def _batch(self, entries: Sequence[PreparedEntry]) -> AddBatch:
        """Returns the AddRequest of `entries`: the last one made when it has the same entries
        and published LAC and LAFR (the bookies of a write set share one batch, so its frame
        is made once). The same entries compare equal at a pointer comparison each."""
        lac, lafr = self._published()
        batch = list(entries)  # a copy: the caller may reuse its list
        last = self._last_batch
        if last is not None and last.lac == lac and last.lafr == lafr and last.entries == batch:
            return last
        made = AddBatch(
            stream_id=self.stream_id,
            term=self.term,
            lac=lac,
            lafr=lafr,
            recovery=self._recovery,
            entries=batch,
        )
        self._last_batch = made
        return made

    def _published(self) -> tuple[int, int]:
        """Returns the (LAC, LAFR) that adds carry."""
        return (
            self.pending.lac if self._fixed_lac is None else self._fixed_lac,
            self.pending.lafr if self._fixed_lafr is None else self._fixed_lafr,
        )

    def _send(self, link: _Link, entries: Sequence[PreparedEntry]) -> None:
        batch = self._batch(entries)
        link.lac_sent = batch.lac
        link.lafr_sent = batch.lafr
        future = link.stream.send(batch)
        now = self._loop.time()
        link.inflight.append(now)
        if entries:
            link.last_sent = now
        future.add_done_callback(lambda f: self._on_response(link, f))
        if self._watchdog is None:
            self._arm_watchdog()

    # ------------------------------------------------------------------ answers

    def _on_response(self, link: _Link, future: asyncio.Future[pb.AddResponse]) -> None:
        if link.inflight:
            link.inflight.popleft()
        if link.dead or self.closed:
            return
        if future.cancelled():
            self._fail(link, "add cancelled")
            return
        error = future.exception()
        if error is not None:
            self._fail(link, f"add failed: {error!r}")
            return
        try:
            self._on_answer(link, future.result())
        except Exception as e:  # a bug: stop the owner rather than lose an answer silently
            log.exception("writer.pipeline_error", stream_id=self.stream_id)
            self._owner.on_error(e)

    def _on_answer(self, link: _Link, response: pb.AddResponse) -> None:
        codes: list[int] = list(response.codes)
        entry_ids = answered_ids(response)  # a range, or every id
        bookie_id = link.bookie_id
        pending = self.pending
        lafr_before = pending.lafr
        if codes.count(_OK) == len(codes) and (
            len(codes) == len(entry_ids) or (len(codes) == 1 and response.entry_count)
        ):
            link.busy_since = None
            # One call per answer: LAC and LAFR move once, not once per entry.
            acknowledged = pending.acknowledge(bookie_id, entry_ids)
        else:
            bad_code = None
            busy: list[int] = []
            ok: list[int] = []
            codes = answered_codes(response)
            for entry_id, code in zip(entry_ids, codes, strict=False):
                if code == _OK:
                    ok.append(entry_id)
                elif code == _TOO_BUSY:
                    busy.append(entry_id)
                elif bad_code is None:
                    bad_code = code
            acknowledged = pending.acknowledge(bookie_id, ok)
            if not entry_ids and codes and codes[0] not in (_OK, _TOO_BUSY):
                bad_code = codes[0]
            if bad_code is not None:
                if bad_code == _INVALID_TERM:
                    self._owner.on_invalid_term(bookie_id, int(response.bookie_term))
                    return
                if bad_code == _TRIMMED:
                    self._owner.on_trimmed(bookie_id, response.message)
                    return
                self._fail(link, f"add answered {Code(bad_code).name}: {response.message}")
            elif busy or (not entry_ids and codes and codes[0] == _TOO_BUSY):
                self._back_off(link, busy)
        if acknowledged:
            self._owner.on_acknowledged(acknowledged)
        if self.pending.lafr != lafr_before:
            self._forget_up_to(self.pending.lafr, lafr_before)
            self._owner.on_fully_replicated()
        if link.outbox and not link.dead and not link.blocked:
            self._flush_link(link)

    def _back_off(self, link: _Link, busy: list[int]) -> None:
        """TOO_BUSY is backpressure, not a failure: the refused entries go back to the front
        of the outbox and the link pauses (doubling backoff); a bookie busy for longer than
        `add_timeout_s` is failed."""
        now = self._loop.time()
        if link.busy_since is None:
            link.busy_since = now
            link.busy_backoff_s = _BUSY_BACKOFF_S[0]
        elif now - link.busy_since > self._options.add_timeout_s:
            self._fail(link, "bookie stayed too busy")
            return
        else:
            link.busy_backoff_s = min(link.busy_backoff_s * 2, _BUSY_BACKOFF_S[1])
        held = self.held
        link.outbox.extendleft(reversed([held[e] for e in busy if e in held]))
        if link.busy_timer is None:
            link.busy_timer = self._loop.call_later(link.busy_backoff_s, self._end_back_off, link)

    def _end_back_off(self, link: _Link) -> None:
        link.busy_timer = None
        self._flush_after_timer(link)

    def _end_linger(self, link: _Link) -> None:
        link.linger_timer = None
        self._flush_after_timer(link)

    def _flush_after_timer(self, link: _Link) -> None:
        if not link.dead and not link.blocked and not self.closed and link.outbox:
            self._flush_link(link)

    def _forget_up_to(self, lafr: int, previous: int) -> None:
        held = self.held
        released = list(map(held.pop, range(previous + 1, lafr + 1), itertools.repeat(None)))
        if None in released:
            released = [entry for entry in released if entry is not None]
        self.held_bytes -= sum(map(_payload_bytes, released))
        self._progress.set()

    def _fail(self, link: _Link, reason: str) -> None:
        if link.dead:
            return
        link.dead = True
        link.outbox.clear()
        link.stream.close()
        self.failed.add(link.bookie_id)
        log.warning(
            "writer.bookie_failed",
            stream_id=self.stream_id,
            term=self.term,
            bookie=link.bookie_id,
            reason=reason,
            recovery=self._recovery,
        )
        self._owner.on_bookie_failed(link.bookie_id, reason)

    def fail_bookie(self, bookie_id: str, reason: str) -> None:
        """Marks `bookie_id` failed (e.g. it did not take the truncate no-op)."""
        link = self._links.get(bookie_id)
        if link is not None:
            self._fail(link, reason)

    # ------------------------------------------------------------------ timers

    def _arm_watchdog(self) -> None:
        self._watchdog = self._loop.call_later(
            self._options.add_timeout_s / 4, self._check_timeouts
        )

    def _check_timeouts(self) -> None:
        self._watchdog = None
        if self.closed:
            return
        now = self._loop.time()
        busy = False
        for link in list(self._links.values()):
            if link.dead or not link.inflight:
                continue
            busy = True
            if now - link.inflight[0] > self._options.add_timeout_s:
                self._fail(link, "add timed out")
        if busy:
            self._arm_watchdog()

    def schedule_explicit_lac(self) -> None:
        """Arms the explicit-LAC timer: unless adds carry the LAC to every bookie of the
        ensemble meanwhile, an empty add carries it shortly."""
        if self._lac_timer is None and not self.closed:
            self._lac_timer = self._loop.call_later(
                self._options.explicit_lac_delay_s, self._send_explicit_lac
            )

    def _send_explicit_lac(self) -> None:
        self._lac_timer = None
        if self.closed:
            return
        lac, lafr = self._published()
        for bookie_id in self.ensemble:
            link = self._links.get(bookie_id)
            if link is None or link.dead or link.blocked or link.outbox:
                continue
            if link.lac_sent < lac or link.lafr_sent < lafr:
                if len(link.inflight) < self._options.inflight_batches_per_bookie:
                    self._send(link, ())
                else:
                    # Its in-flight answers re-arm the timer when they move the LAC further.
                    self.schedule_explicit_lac()

    def lac_behind(self) -> bool:
        """Returns whether some live bookie of the ensemble was not sent the current LAC or
        LAFR (a closing writer publishes both: the next takeover starts reading at LAFR)."""
        lac, lafr = self._published()
        for bookie_id in self.ensemble:
            link = self._links.get(bookie_id)
            if (
                link is not None
                and not link.dead
                and (link.lac_sent < lac or link.lafr_sent < lafr)
            ):
                return True
        return False

    # ------------------------------------------------------------------ waiting

    async def wait_progress(self, timeout_s: float) -> None:
        """Returns when LAFR moved, or after `timeout_s`."""
        self._progress.clear()
        try:
            await asyncio.wait_for(self._progress.wait(), timeout_s)
        except TimeoutError:
            pass

    def inflight_batches(self) -> int:
        """Returns how many batches are unanswered over all live links."""
        return sum(len(link.inflight) for link in self._links.values() if not link.dead)

    # ------------------------------------------------------------------ ensemble changes

    def _set_ensemble(
        self, ensemble: Sequence[str], blocked: Sequence[str], *, reopen_failed: bool
    ) -> None:
        self._write_sets = tuple(
            self.config.write_set_bookies(ensemble, r) for r in range(self.config.ensemble)
        )
        for bookie_id in ensemble:
            link = self._links.get(bookie_id)
            if link is not None and link.dead and not reopen_failed:
                # It missed entries that are still held: it stays failed, to be replaced in
                # turn. Reopening it would forget that, and if its link broke in a blip
                # nothing would fail again: LAFR stuck, the window full, the writer hung.
                continue
            if link is None or link.dead:
                stream = self._transport.open_add_stream(
                    bookie_id, data_port=self._options.data_port
                )
                self._links[bookie_id] = _Link(bookie_id, stream, bookie_id in blocked)
                self.failed.discard(bookie_id)

    def apply_change(self, change: EnsembleChange) -> None:
        """Applies a planned ensemble change locally: the replacement takes the failed bookie's
        place in the held entries' write sets (which it will receive once `unblock`ed) and the
        failed bookie leaves their ack sets."""
        self.fragments = list(change.fragments)
        failed, replacement = change.failed_bookie, change.replacement
        old = self._links.pop(failed, None)
        if old is not None and not old.dead:
            old.dead = True
            old.outbox.clear()
            old.stream.close()
        self.failed.discard(failed)
        self.quarantined.add(failed)
        self.unstored_away.add(failed)
        self._set_ensemble(
            self.ensemble,
            blocked=(replacement,),
            reopen_failed=not self._options.protections.keep_failed_bookies,
        )
        resend = self.pending.replace_bookie(failed, replacement)
        link = self._links[replacement]
        link.outbox.extend(self.held[i] for i in resend)
        log.info(
            "writer.ensemble_changed",
            stream_id=self.stream_id,
            term=self.term,
            failed=failed,
            replacement=replacement,
            first_entry_id=change.first_entry_id,
            resend=len(resend),
        )

    def unblock(self, bookie_id: str) -> None:
        """Lets `bookie_id` (a committed replacement) receive its entries."""
        link = self._links.get(bookie_id)
        if link is not None and link.blocked:
            link.blocked = False
            if link.outbox and not link.dead:
                self._flush_link(link)

    def roll(self, first_entry_id: int, ensemble: Sequence[str]) -> None:
        """Starts a new fragment at `first_entry_id` (the next id; nothing may be held) on
        `ensemble`, closing the streams of the bookies that left."""
        invariant(
            first_entry_id == self.pending.next_entry_id and not self.held,
            "a roll happens with every entry at its whole write set",
            first_entry_id=first_entry_id,
            next_entry_id=self.pending.next_entry_id,
            held=len(self.held),
        )
        self.fragments.append(FragmentEnsemble(first_entry_id, tuple(ensemble)))
        self.quarantined.clear()  # a new fragment gives the bookies that failed another chance
        for bookie_id in list(self._links):
            if bookie_id not in ensemble:
                link = self._links.pop(bookie_id)
                link.dead = True
                link.stream.close()
        self._set_ensemble(ensemble, blocked=(), reopen_failed=True)  # nothing is held

    def close(self) -> None:
        """Closes every stream; unanswered batches are abandoned."""
        self.closed = True
        for timer in (self._lac_timer, self._watchdog):
            if timer is not None:
                timer.cancel()
        for link in self._links.values():
            for link_timer in (link.busy_timer, link.linger_timer):
                if link_timer is not None:
                    link_timer.cancel()
        self._lac_timer = self._watchdog = None
        for link in self._links.values():
            if not link.dead:
                link.dead = True
                link.stream.close()
