"""A simulated bookie: per-stream state in memory, serving the wire requests with the SAME rules
as the real bookie (`stream.bookie.storage`), through the same pure functions: the term rule
(`stream.protocol.term_decision`), limbo (`stream.protocol.limbo_code`), the TRUNCATE flag
(storing it deletes every higher entry), Truncate and Trim.

Durability follows the real storage engine: term changes, truncations, trims and limbo are
journaled (durable at once); entries are durable at once only with `journal_write_data`
(recovery write-backs and truncating no-ops always), otherwise at the next flush. A process
crash loses what is not durable; a disk loss loses everything (the cookie-mismatch case). On
restart after an unclean stop the bookie runs BP-46 phase one (term := max(local, metadata
term) and limbo for every non-sealed stream naming it) before serving, and phase two in the
background: once a recovery of a newer term fixed the stream's end, it copies its share up to
that end from its peers and clears limbo.

One deliberate difference from docs/design.md §4, which marks limbo after ANY unclean start: limbo
is set only when entries may have been lost (no `journal_write_data`, or a lost disk). A bookie
whose entries were all journaled lost nothing, and marking it limbo can stall every recovery
for good: once AQ bookies of one write set are in limbo, the entry after the end can never
get QC explicit negatives, so no recovery completes, and limbo only clears after one does.

A bookie whose disk was lost also learns, after its restart, the term of any stream created
before then that it holds no state for (a SEALED stream, or one whose fragments no longer name
it: phase one skips both) from metadata before it serves a term-bearing request for it
(`stream.protocol.must_learn_term`, docs/design.md §4), as the real bookie's `stream.bookie.terms`.

Each of phase one's two halves can be switched off (`BookieProtections`), and so can that
metadata check and the term rule itself: with `enforce_terms=False` the bookie serves every
term ("no fence").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from stream.client.entries import checksum_ok
from stream.errors import StreamError, StreamNotFoundError
from stream.metadata.model import Fragment, StreamMeta, StreamState
from stream.protocol import (
    Code,
    EntryFlag,
    TermDecision,
    limbo_code,
    must_learn_term,
    term_decision,
)
from stream.sim.trace import Trace
from stream.wire import bookie_pb2 as pb

log = structlog.get_logger(__name__)

OK = int(Code.OK)
_TRUNCATE = int(EntryFlag.TRUNCATE)
_MAX_ENTRY_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class BookieProtections:
    """The bookie-side protections the simulator may switch off.

    - `enforce_terms`: the term rule; off, every term-bearing request is served whatever its
      term (the bookie still records the highest term it saw): "no fence".
    - `phase_one_fence`: after an unclean start, raise each named stream's term to the
      metadata term (BP-46 "fence all ledgers", with terms).
    - `limbo`: after an unclean start, mark each named non-sealed stream limbo (explicit
      negatives become UNKNOWN until phase two repaired it).
    - `wiped_term_check`: after a disk loss, learn the term of a stream the bookie holds no
      state for from metadata before serving a term-bearing request for it.
    """

    enforce_terms: bool = True
    phase_one_fence: bool = True
    limbo: bool = True
    wiped_term_check: bool = True


class _Stream:
    """One stream's state on one bookie: what is visible now and what survives a crash."""

    __slots__ = (
        "term",
        "limbo",
        "lac",
        "lafr",
        "first_entry_id",
        "entries",
        "durable",
        "unflushed",
        "durable_lac",
        "durable_lafr",
    )

    def __init__(self) -> None:
        self.term = 0
        self.limbo = False
        self.lac = -1
        self.lafr = -1
        self.first_entry_id = 0
        self.entries: dict[int, pb.Entry] = {}
        self.durable: dict[int, pb.Entry] = {}
        self.unflushed: set[int] = set()
        self.durable_lac = -1
        self.durable_lafr = -1

    @property
    def last_entry_id(self) -> int:
        return max(self.entries, default=-1)


# What phase one and two read of the metadata, and how phase two reads a peer's copy.
StreamsWithBookie = Callable[[str], list[tuple[StreamMeta, list[Fragment]]]]
Snapshot = Callable[[int], tuple[StreamMeta, int, list[Fragment]]]
PeerEntry = Callable[[str, int, int], pb.Entry | None]


class SimBookie:
    """One simulated bookie. Requests are handled synchronously (one virtual instant); only a
    ReadLac long poll answers later, through a future."""

    def __init__(
        self,
        bookie_id: str,
        *,
        trace: Trace,
        journal_write_data: bool = True,
        protections: BookieProtections = BookieProtections(),
        repair_interval_s: float = 0.05,
    ) -> None:
        self.bookie_id = bookie_id
        self.journal_write_data = journal_write_data
        self.protections = protections
        self._trace = trace
        self._repair_interval_s = repair_interval_s
        self.streams: dict[int, _Stream] = {}
        self.up = True
        self.incarnation = 0
        self._lac_waiters: dict[int, list[tuple[int, asyncio.Future[pb.ReadLacResponse]]]] = {}
        self._repair_task: asyncio.Task[None] | None = None
        # Set by the simulator: metadata views for phase one/two and a peer reader.
        self.streams_with_bookie: StreamsWithBookie | None = None
        self.snapshot: Snapshot | None = None
        self.peer_entry: PeerEntry | None = None
        # Set by the simulator: the stream id counter in metadata.
        self.next_stream_id: Callable[[], int] | None = None
        # Streams below this id may have had a term the lost disk took (0: none); durable.
        self.forgotten_below = 0
        self._lost_disk = False
        # Streams in limbo since the last unclean start, with the metadata term then.
        self._limbo_since: dict[int, int] = {}
        self._unclean = False
        # Whether the last unclean stop may have lost entries (no journal, or a lost disk).
        self._lost_data = False

    # ------------------------------------------------------------------ term rule

    def _decide(self, state: _Stream | None, request_term: int) -> TermDecision:
        decision = term_decision(0 if state is None else state.term, request_term)
        if decision is TermDecision.REJECT and not self.protections.enforce_terms:
            return TermDecision.ACCEPT  # "no fence": serve it anyway
        return decision

    def _learn_term(self, stream_id: int) -> Code | None:
        """Records metadata's term for a stream whose term a lost disk may have taken (once:
        the state it creates is kept); returns NO_SUCH_STREAM for a deleted stream, None when
        the request may go on to the term rule."""
        known = stream_id in self.streams
        if not must_learn_term(stream_id, known=known, forgotten_below=self.forgotten_below):
            return None
        assert self.snapshot is not None
        try:
            meta, _, _ = self.snapshot(stream_id)
        except StreamNotFoundError:
            self._trace.record("learn", b=self.bookie_id, s=stream_id, t="deleted")
            return Code.NO_SUCH_STREAM
        self._raise_term(self._state(stream_id), meta.term)
        self._trace.record("learn", b=self.bookie_id, s=stream_id, t=meta.term)
        return None

    def _state(self, stream_id: int) -> _Stream:
        state = self.streams.get(stream_id)
        if state is None:
            state = self.streams[stream_id] = _Stream()
        return state

    @staticmethod
    def _raise_term(state: _Stream, term: int) -> None:
        if term > state.term:
            state.term = term  # journaled: durable at once

    # ------------------------------------------------------------------ storing

    def _store(self, stream_id: int, state: _Stream, entry: pb.Entry, recovery: bool) -> None:
        entry_id = entry.entry_id
        state.entries[entry_id] = entry
        if self.journal_write_data or recovery or entry.flags & _TRUNCATE:
            # Recovery write-backs and truncating no-ops are journaled even without the
            # journal: they may replace an older, flushed value at their id that a crash must
            # not bring back.
            state.durable[entry_id] = entry
            state.unflushed.discard(entry_id)
        else:
            state.unflushed.add(entry_id)
        if entry.flags & _TRUNCATE:
            self._delete_above(state, entry_id)

    @staticmethod
    def _delete_above(state: _Stream, after_entry_id: int) -> None:
        # A truncation is journaled: it holds across a crash even when entries are not.
        for entries in (state.entries, state.durable):
            for entry_id in [i for i in entries if i > after_entry_id]:
                del entries[entry_id]
        state.unflushed = {i for i in state.unflushed if i <= after_entry_id}

    def _advance_lac(self, stream_id: int, state: _Stream, lac: int, lafr: int) -> None:
        if lafr > state.lafr:
            state.lafr = lafr
        if lac > state.lac:
            state.lac = lac
            waiters = self._lac_waiters.get(stream_id)
            if waiters:
                keep = []
                for known, future in waiters:
                    if lac > known and not future.done():
                        future.set_result(pb.ReadLacResponse(code=OK, lac=lac, lafr=state.lafr))
                    elif not future.done():
                        keep.append((known, future))
                self._lac_waiters[stream_id] = keep

    def flush(self) -> None:
        """Makes every entry and the LAC/LAFR durable (the periodic flush of the write cache
        to the entry logs and the index)."""
        for state in self.streams.values():
            for entry_id in state.unflushed:
                entry = state.entries.get(entry_id)
                if entry is not None:
                    state.durable[entry_id] = entry
            state.unflushed.clear()
            state.durable_lac, state.durable_lafr = state.lac, state.lafr

    # ------------------------------------------------------------------ requests

    def add(self, request: pb.AddRequest) -> pb.AddResponse:
        """Returns the AddResponse to one batch (the storage engine's `add_batch` rules)."""
        stream_id = request.stream_id
        entries = request.entries
        count = max(len(entries), 1)
        response = pb.AddResponse(stream_id=stream_id, request_id=request.request_id)
        response.entry_ids.extend([e.entry_id for e in entries])
        state = self.streams.get(stream_id)
        if stream_id == 0 or request.lac < -1 or request.lafr < -1:
            response.codes.extend([int(Code.BAD_REQUEST)] * count)
            return response
        refused = self._learn_term(stream_id)
        if refused is not None:
            response.codes.extend([int(refused)] * count)
            return response
        state = self.streams.get(stream_id)
        decision = self._decide(state, request.term)
        if not decision.serves:
            response.codes.extend([int(decision.code)] * count)
            response.bookie_term = 0 if state is None else state.term
            self._trace.record(
                "add", b=self.bookie_id, t=request.term, ids=_ids(entries), code=decision.name
            )
            return response
        state = self._state(stream_id)
        self._raise_term(state, request.term)
        codes = []
        for entry in entries:
            if not _valid(stream_id, entry):
                codes.append(int(Code.BAD_REQUEST))
            elif entry.entry_id < state.first_entry_id:
                codes.append(int(Code.TRIMMED))
            else:
                self._store(stream_id, state, entry, request.recovery)
                codes.append(OK)
        self._advance_lac(stream_id, state, request.lac, request.lafr)
        if self.journal_write_data and (entries or decision is TermDecision.ACCEPT_NEW):
            # The batch is journaled whole: replaying it restores its LAC and LAFR (an empty
            # batch, the explicit LAC, is not journaled: that LAC waits for a flush).
            state.durable_lac = max(state.durable_lac, request.lac)
            state.durable_lafr = max(state.durable_lafr, request.lafr)
        response.codes.extend(codes or [OK])
        response.bookie_term = state.term
        self._trace.record(
            "add",
            b=self.bookie_id,
            t=request.term,
            ids=_ids(entries),
            rec=int(request.recovery),
            lac=request.lac,
        )
        return response

    def fence(self, request: pb.FenceRequest) -> pb.FenceResponse:
        """Returns the FenceResponse: the term recorded (even for an unknown stream) and what
        the bookie knows of the stream's end."""
        state = self.streams.get(request.stream_id)
        if request.stream_id == 0 or request.term == 0:
            return pb.FenceResponse(
                code=int(Code.BAD_REQUEST), bookie_term=0 if state is None else state.term
            )
        refused = self._learn_term(request.stream_id)
        if refused is not None:
            return pb.FenceResponse(code=int(refused))
        state = self.streams.get(request.stream_id)
        decision = self._decide(state, request.term)
        if decision.serves:
            state = self._state(request.stream_id)
            self._raise_term(state, request.term)
        self._trace.record("fence", b=self.bookie_id, t=request.term, code=decision.name)
        assert state is not None  # REJECT implies a known stream
        return pb.FenceResponse(
            code=int(decision.code),
            bookie_term=state.term,
            lac=state.lac,
            lafr=state.lafr,
            last_entry_id=state.last_entry_id,
            limbo=state.limbo,
        )

    def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        """Returns one entry; a recovery read (term > 0) obeys the term rule first. In limbo an
        explicit negative becomes UNKNOWN."""
        stream_id, entry_id, term = request.stream_id, request.entry_id, request.term
        if stream_id == 0 or entry_id < 0:
            return pb.ReadResponse(code=int(Code.BAD_REQUEST))
        if term:
            refused = self._learn_term(stream_id)
            if refused is not None:
                return pb.ReadResponse(code=int(refused), lac=-1)
            state = self.streams.get(stream_id)
            decision = self._decide(state, term)
            if not decision.serves:
                self._trace.record("read", b=self.bookie_id, e=entry_id, t=term, code="IT")
                return pb.ReadResponse(
                    code=int(decision.code),
                    lac=-1 if state is None else state.lac,
                    bookie_term=0 if state is None else state.term,
                    first_entry_id=0 if state is None else state.first_entry_id,
                )
            # Recorded even for a stream never seen: the TLA+ spec fences on recovery reads.
            self._raise_term(self._state(stream_id), term)
        state = self.streams.get(stream_id)
        if state is None:
            self._trace.record("read", b=self.bookie_id, e=entry_id, t=term, code="NSS")
            return pb.ReadResponse(code=int(Code.NO_SUCH_STREAM), lac=-1)
        if entry_id < state.first_entry_id:
            return pb.ReadResponse(
                code=int(Code.TRIMMED),
                lac=state.lac,
                bookie_term=state.term,
                first_entry_id=state.first_entry_id,
            )
        entry = state.entries.get(entry_id)
        code = OK if entry is not None else int(limbo_code(Code.NO_SUCH_ENTRY, state.limbo))
        self._trace.record("read", b=self.bookie_id, e=entry_id, t=term, code=code)
        response = pb.ReadResponse(
            code=code, lac=state.lac, bookie_term=state.term, first_entry_id=state.first_entry_id
        )
        if entry is not None:
            response.entry.CopyFrom(entry)
        return response

    def read_range(self, request: pb.ReadRangeRequest) -> list[pb.ReadRangeResponse]:
        """Returns the ReadRange responses: the entries from the first on while held; the last
        response carries the code that ended the range (OK: all of it)."""
        state = self.streams.get(request.stream_id)
        if state is None:
            return [pb.ReadRangeResponse(code=int(Code.NO_SUCH_STREAM), lac=-1)]
        first, last = request.first_entry_id, request.last_entry_id
        if first < 0 or last < first:
            return [pb.ReadRangeResponse(code=int(Code.BAD_REQUEST), lac=state.lac)]
        if first < state.first_entry_id:
            return [
                pb.ReadRangeResponse(
                    code=int(Code.TRIMMED), lac=state.lac, first_entry_id=state.first_entry_id
                )
            ]
        found = []
        code = OK
        for entry_id in range(first, last + 1):
            entry = state.entries.get(entry_id)
            if entry is None:
                code = int(limbo_code(Code.NO_SUCH_ENTRY, state.limbo))
                break
            found.append(entry)
        self._trace.record("range", b=self.bookie_id, first=first, n=len(found), code=code)
        response = pb.ReadRangeResponse(code=code, lac=state.lac)
        response.entries.extend(found)
        return [response]

    def read_lac(
        self, request: pb.ReadLacRequest
    ) -> pb.ReadLacResponse | asyncio.Future[pb.ReadLacResponse]:
        """Returns the LAC at once when it is above `known_lac` (or no wait is asked), else a
        future answered when it moves or when the wait ends."""
        stream_id, known = request.stream_id, request.known_lac
        if stream_id == 0 or known < -1:
            return pb.ReadLacResponse(code=int(Code.BAD_REQUEST))
        state = self.streams.get(stream_id)
        if state is not None and (state.lac > known or request.timeout_ms == 0):
            return pb.ReadLacResponse(code=OK, lac=state.lac, lafr=state.lafr)
        if request.timeout_ms == 0:
            return pb.ReadLacResponse(code=int(Code.NO_SUCH_STREAM), lac=-1, lafr=-1)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[pb.ReadLacResponse] = loop.create_future()
        self._lac_waiters.setdefault(stream_id, []).append((known, future))

        def expire() -> None:
            if future.done():
                return
            current = self.streams.get(stream_id)
            if current is None:
                future.set_result(pb.ReadLacResponse(code=int(Code.NO_SUCH_STREAM), lac=-1))
            else:
                future.set_result(pb.ReadLacResponse(code=OK, lac=current.lac, lafr=current.lafr))

        loop.call_later(request.timeout_ms / 1000, expire)
        return future

    def truncate(self, request: pb.TruncateRequest) -> pb.TruncateResponse:
        """Returns the TruncateResponse after dropping every entry above `after_entry_id`
        (term rule first; an unknown stream is created with the term)."""
        state = self.streams.get(request.stream_id)
        local = 0 if state is None else state.term
        if request.stream_id == 0 or request.term == 0 or request.after_entry_id < -1:
            return pb.TruncateResponse(code=int(Code.BAD_REQUEST), bookie_term=local)
        refused = self._learn_term(request.stream_id)
        if refused is not None:
            return pb.TruncateResponse(code=int(refused))
        state = self.streams.get(request.stream_id)
        local = 0 if state is None else state.term
        decision = self._decide(state, request.term)
        self._trace.record(
            "truncate",
            b=self.bookie_id,
            t=request.term,
            after=request.after_entry_id,
            code=decision.name,
        )
        if not decision.serves:
            return pb.TruncateResponse(code=int(decision.code), bookie_term=local)
        state = self._state(request.stream_id)
        self._raise_term(state, request.term)
        self._delete_above(state, request.after_entry_id)
        return pb.TruncateResponse(code=OK, bookie_term=state.term)

    def trim(self, request: pb.TrimRequest) -> pb.TrimResponse:
        """Returns the TrimResponse after dropping every entry below `before_entry_id`."""
        if request.stream_id == 0 or request.before_entry_id < 0:
            return pb.TrimResponse(code=int(Code.BAD_REQUEST))
        state = self.streams.get(request.stream_id)
        if state is None:
            return pb.TrimResponse(code=int(Code.NO_SUCH_STREAM))
        if request.before_entry_id > state.first_entry_id:
            state.first_entry_id = request.before_entry_id
            for entries in (state.entries, state.durable):
                for entry_id in [i for i in entries if i < request.before_entry_id]:
                    del entries[entry_id]
        return pb.TrimResponse(code=OK, first_entry_id=state.first_entry_id)

    def stream_state(self, request: pb.StreamStateRequest) -> pb.StreamStateResponse:
        """Returns the bookie's state of one stream (NO_SUCH_STREAM when it has none)."""
        state = self.streams.get(request.stream_id)
        if state is None:
            return pb.StreamStateResponse(
                code=int(Code.NO_SUCH_STREAM), lac=-1, lafr=-1, last_entry_id=-1
            )
        return pb.StreamStateResponse(
            code=OK,
            term=state.term,
            limbo=state.limbo,
            lac=state.lac,
            lafr=state.lafr,
            last_entry_id=state.last_entry_id,
            first_entry_id=state.first_entry_id,
        )

    # ------------------------------------------------------------------ crash and restart

    def crash(self, *, lose_disk: bool = False) -> None:
        """Stops the bookie abruptly: what is not durable is lost (everything with
        `lose_disk`: the disk is replaced, the cookie no longer matches)."""
        self.up = False
        self.incarnation += 1
        if self._repair_task is not None:
            self._repair_task.cancel()
            self._repair_task = None
        for waiters in self._lac_waiters.values():
            for _, future in waiters:
                if not future.done():
                    future.set_exception(ConnectionResetError(f"{self.bookie_id} crashed"))
        self._lac_waiters.clear()
        if lose_disk:
            self.streams.clear()
            self._limbo_since.clear()
        else:
            for state in self.streams.values():
                state.entries = dict(state.durable)
                state.unflushed.clear()
                state.lac, state.lafr = state.durable_lac, state.durable_lafr
        self._unclean = True
        self._lost_disk = self._lost_disk or lose_disk
        self._lost_data = lose_disk or not self.journal_write_data
        self._trace.record("crash", b=self.bookie_id, disk=int(lose_disk))

    def stop_cleanly(self) -> None:
        """Stops the bookie after flushing everything (no phase one at the next start)."""
        self.flush()
        self.up = False
        self.incarnation += 1
        self._unclean = False
        for waiters in self._lac_waiters.values():
            for _, future in waiters:
                if not future.done():
                    future.set_exception(ConnectionResetError(f"{self.bookie_id} stopped"))
        self._lac_waiters.clear()
        self._trace.record("stop", b=self.bookie_id)

    def start(self) -> None:
        """Starts the bookie: after an unclean stop, phase one runs before it serves and
        phase two in the background."""
        unclean = self._unclean
        self._unclean = False
        if unclean:
            self._phase_one()
        if self._lost_disk:
            # The cookie fix: which streams may have had a term the disk took.
            self._lost_disk = False
            if self.protections.wiped_term_check and self.next_stream_id is not None:
                self.forgotten_below = self.next_stream_id()
        self.up = True
        self.incarnation += 1
        self._trace.record("start", b=self.bookie_id, unclean=int(unclean))
        if self._limbo_since and self._repair_task is None:
            self._repair_task = asyncio.ensure_future(self._phase_two())

    def _phase_one(self) -> None:
        """BP-46 phase one with terms, for every non-sealed stream naming this bookie."""
        if self.streams_with_bookie is None:
            return
        for meta, _fragments in self.streams_with_bookie(self.bookie_id):
            if meta.state is StreamState.SEALED:
                continue
            state = self._state(meta.id)
            if self.protections.phase_one_fence:
                self._raise_term(state, meta.term)
            if self.protections.limbo and self._lost_data:
                state.limbo = True
                # Repair waits for a recovery of a term above the one known now.
                self._limbo_since[meta.id] = meta.term
            self._trace.record(
                "phase1", b=self.bookie_id, s=meta.id, t=state.term, limbo=int(state.limbo)
            )

    async def _phase_two(self) -> None:
        """Repairs each limbo stream once a recovery of a newer term fixed its end, then
        clears limbo."""
        while self._limbo_since:
            await asyncio.sleep(self._repair_interval_s)
            for stream_id, boot_term in sorted(self._limbo_since.items()):
                try:
                    if self._repair(stream_id, boot_term):
                        del self._limbo_since[stream_id]
                except StreamError as e:
                    log.debug("sim.bookie.repair_failed", bookie=self.bookie_id, error=str(e))
        self._repair_task = None

    def _repair(self, stream_id: int, boot_term: int) -> bool:
        """Returns True once the stream's share up to the fixed end is copied and limbo is
        cleared; False to try again later."""
        assert self.snapshot is not None and self.peer_entry is not None
        state = self.streams.get(stream_id)
        if state is None:
            return True
        meta, _, fragments = self.snapshot(stream_id)
        history = [pair for pair in meta.term_history if pair[0] > boot_term]
        if not history:
            return False  # no recovery of a newer term has fixed the end yet
        end = history[-1][1] - 1
        config = meta.quorum
        for index, fragment in enumerate(fragments):
            if self.bookie_id not in fragment.ensemble:
                continue
            last = fragment.last_entry_id
            if last is None:
                following = fragments[index + 1 :]
                last = following[0].first_entry_id - 1 if following else end
            position = fragment.ensemble.index(self.bookie_id)
            first = max(fragment.first_entry_id, meta.first_entry_id, state.first_entry_id)
            for entry_id in config.bookie_index_entries(position, first, min(last, end)):
                if entry_id in state.entries:
                    continue
                write_set = config.write_set_bookies(fragment.ensemble, entry_id)
                copy = None
                for peer in write_set:
                    if peer != self.bookie_id:
                        copy = self.peer_entry(peer, stream_id, entry_id)
                        if copy is not None:
                            break
                if copy is None:
                    return False
                self._store(stream_id, state, copy, False)
        state.limbo = False
        self._trace.record("phase2", b=self.bookie_id, s=stream_id, end=end)
        return True

    def set_disk_fault(self, kind: str | None) -> None:
        """Puts the bookie's disk in fault `kind` ("read_only" or "full") or back to health
        (None). A faulty disk makes the bookie read-only, as the real one: adds (recovery
        write-backs excepted) and truncations are refused with READ_ONLY; reads still serve."""
        if kind not in ("read_only", "full", None):
            raise ValueError(f"unknown disk fault {kind!r}")
        # Instance attributes shadow the class's handlers while the fault lasts.
        for name in ("add", "truncate"):
            self.__dict__.pop(name, None)
        self._trace.record("disk_fault", b=self.bookie_id, fault=kind or "-")
        if kind is None:
            return
        serve_add = self.add

        def add(request: pb.AddRequest) -> pb.AddResponse:
            if request.recovery:
                return serve_add(request)
            state = self.streams.get(request.stream_id)
            response = pb.AddResponse(
                stream_id=request.stream_id,
                request_id=request.request_id,
                bookie_term=0 if state is None else state.term,
            )
            response.entry_ids.extend([e.entry_id for e in request.entries])
            response.codes.extend([int(Code.READ_ONLY)] * max(len(request.entries), 1))
            return response

        def truncate(request: pb.TruncateRequest) -> pb.TruncateResponse:
            state = self.streams.get(request.stream_id)
            return pb.TruncateResponse(
                code=int(Code.READ_ONLY), bookie_term=0 if state is None else state.term
            )

        self.add = add  # type: ignore[method-assign]
        self.truncate = truncate  # type: ignore[method-assign]

    # ------------------------------------------------------------------ for the checker

    def held(self, stream_id: int, entry_id: int) -> pb.Entry | None:
        """Returns the entry this bookie would serve now (None when down or absent)."""
        if not self.up:
            return None
        state = self.streams.get(stream_id)
        return None if state is None else state.entries.get(entry_id)


def _ids(entries: object) -> str:
    ids = [e.entry_id for e in entries]  # type: ignore[attr-defined]
    if not ids:
        return "-"
    return f"{ids[0]}" if len(ids) == 1 else f"{ids[0]}..{ids[-1]}"


def _valid(stream_id: int, entry: pb.Entry) -> bool:
    """Returns whether an added entry passes the bookie's checks (id, size, checksum)."""
    if entry.entry_id < 0 or len(entry.payload) > _MAX_ENTRY_BYTES:
        return False
    return checksum_ok(stream_id, entry)
