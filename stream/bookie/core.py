"""The bookie's request handling without a transport: a request message in, a response
message out. The term rule, limbo, the refusals of `MetadataTerms`, read-only mode and
TOO_BUSY are decided here (and in the storage engine it drives), so that the gRPC service
(`stream.bookie.server`) is a thin edge over it and the simulator runs the same code.

Everything here runs on one asyncio event loop, the only thread that may call the storage
engine. Storage durability futures complete on the journal thread (or in the simulator's
journal step); handlers await them before answering, because an answer is a promise that the
change survives a crash.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.metadata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from stream.bookie import metrics
from stream.bookie.access import audit_recovery_add
from stream.bookie.codes import (
    BAD_REQUEST,
    INTERNAL,
    NO_SUCH_STREAM,
    OK,
    READ_ONLY,
    TOO_BUSY,
    TRIMMED,
    wire_code,
)
from stream.bookie.config import BookieConfig
from stream.bookie.disk import DiskStatus
from stream.bookie.durable import GroupWaits
from stream.bookie.lac_polls import LacPolls
from stream.bookie.malformed import (
    malformed_add,
    malformed_fence,
    malformed_read,
    malformed_read_lac,
    malformed_read_range,
    malformed_stream_state,
    malformed_trim,
    malformed_truncate,
)
from stream.bookie.read_only import ReadOnlyMode
from stream.bookie.request_log import Peer, RequestLog
from stream.bookie.storage.outcomes import (
    AddOutcome,
    FenceResult,
    ReadResult,
    TrimOutcome,
    TruncateOutcome,
)
from stream.bookie.storage.scanned import AddRequest, entry_ids
from stream.bookie.storage.state import StreamStateView
from stream.bookie.terms import OVERWRITE, MetadataTerms, Refusal
from stream.framing.range_answer import FramedEntries
from stream.logs import get_logger
from stream.wire import bookie_pb2 as pb

log = get_logger(__name__)

# Bound on concurrent ReadLac long polls (each holds a future and a gRPC call); beyond it a
# poll is answered TOO_BUSY at once rather than letting idle tailers exhaust the process.
MAX_LAC_WAITERS = 10_000
# Room left in a gRPC message for the ReadRange envelope around its entries.
_READ_RANGE_ENVELOPE_BYTES = 64 << 10

try:
    VERSION = importlib.metadata.version("streamkeeper")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    VERSION = "0+unknown"


class Storage(Protocol):
    """The parts of `stream.bookie.storage.StreamStorage` the service uses (see its docs)."""

    on_lac_advanced: Callable[[int, int], None] | None

    def add_batch(self, request: AddRequest, raw: bytes | None = None) -> AddOutcome: ...
    def fence(self, stream_id: int, term: int) -> FenceResult: ...
    def read(self, stream_id: int, entry_id: int, term: int = 0) -> ReadResult: ...
    def read_range(
        self, stream_id: int, first: int, last: int, max_batch_bytes: int, *, raw: bool = False
    ) -> Iterator[tuple[pb.Code, list[Any] | FramedEntries]]: ...
    def lac(self, stream_id: int) -> tuple[int, int] | None: ...
    def truncate(self, stream_id: int, term: int, after_entry_id: int) -> TruncateOutcome: ...
    def trim(self, stream_id: int, before_entry_id: int) -> TrimOutcome: ...
    def stream_state(self, stream_id: int) -> StreamStateView | None: ...
    def stream_ids(self) -> Iterable[int]: ...
    def knows(self, stream_id: int) -> bool: ...
    def term(self, stream_id: int) -> int: ...
    def record_term(self, stream_id: int, term: int) -> concurrent.futures.Future[None]: ...


@dataclass(frozen=True)
class StartReport:
    """What the bookie found when it started: shown by Info and the start log line."""

    unclean_start: bool
    replayed_records: int
    replayed_entries: int


# An add batch on its way: the response (without its ids and codes: `answer_add` writes them in
# the form the stream takes), the journal future it waits for, its codes, its entry ids.
_PendingAdd = tuple[
    pb.AddResponse, "concurrent.futures.Future[Any] | None", list[pb.Code], list[int]
]


def _name_entries(
    response: pb.AddResponse, ids: list[int], codes: list[pb.Code], ranged: bool
) -> None:
    """Writes the ids and codes of an Add answer: with `ranged`, consecutive ids as a range and
    codes that agree as one (data port version 2), else every id and its code. Whole-array
    operations on lists the storage built anyway: no per-entry Python here."""
    count = len(ids)
    if ranged and count and ids == list(range(ids[0], ids[0] + count)):
        response.first_entry_id = ids[0]
        response.entry_count = count
        if codes.count(codes[0]) == len(codes):
            response.codes.append(codes[0])
            return
    else:
        response.entry_ids.extend(ids)
    response.codes.extend(codes)


async def _await_durable(durable: concurrent.futures.Future[Any] | None) -> None:
    """Returns once `durable` (a journal fsync future, or None) completed; raises its error."""
    if durable is None:
        return
    if durable.done():
        durable.result()
        return
    await asyncio.wrap_future(durable)


class BookieCore:
    """The Bookie service's request handling over one storage engine, transport-neutral:
    each method takes the request message and returns the response message (`read_range`
    yields its batches). `set_disk_status` and `set_draining` switch read-only mode;
    `start_report` is what Info tells about the start. `context`, where a method takes one,
    only names the caller in the refusal log."""

    def __init__(
        self,
        config: BookieConfig,
        storage: Storage,
        *,
        instance_id: str,
        start_report: StartReport,
        disk_status: DiskStatus | None = None,
        metadata_terms: MetadataTerms | None = None,
    ) -> None:
        """`metadata_terms`: the checks against metadata before the term rule and trims
        (terms a lost disk took, terms and trims metadata cannot justify:
        `stream.bookie.terms`); None serves without them (no metadata)."""
        self._config = config
        self._storage = storage
        self._terms = metadata_terms
        self._instance_id = instance_id
        self._start_report = start_report
        self._mode = ReadOnlyMode(disk_status, config.disk_usage_threshold)
        self._loop = asyncio.get_running_loop()
        # Loop-side waits for journal groups (`finish_add`; the data port's done callbacks).
        self.group_waits = GroupWaits()
        self._lac_polls = LacPolls(MAX_LAC_WAITERS)
        storage.on_lac_advanced = self.notify_lac_advanced
        self._log = RequestLog()
        # The server counts every answer: the counter's own method, no call in between.
        self.count = self._log.count

    # -- state set by the process ---------------------------------------------------------

    @property
    def disk_status(self) -> DiskStatus | None:
        """Returns the latest disk check (None before the first)."""
        return self._mode.disk_status

    @property
    def read_only(self) -> bool:
        """Read-only: the disk is nearly full, or the bookie is being drained."""
        return self._mode.read_only

    @property
    def draining(self) -> bool:
        return self._mode.draining

    def set_draining(self, draining: bool) -> None:
        """Switches drain mode (`/bookies/draining/<bookie_id>` exists)."""
        self._mode.set_draining(draining)

    def set_disk_status(self, status: DiskStatus) -> None:
        """Records the latest disk check; read-only mode follows it."""
        self._mode.set_disk_status(status)

    def notify_lac_advanced(self, stream_id: int, lac: int) -> None:
        """Wakes the long polls of `stream_id` (storage calls this when its LAC moves; any
        thread may call it)."""
        self._lac_polls.notify(stream_id)

    async def _refusal(
        self, rpc: str, stream_id: int, term: int, context: Peer | None
    ) -> Refusal | None:
        """Returns why a request carrying `term` for `stream_id` must be refused before the
        term rule (metadata does not justify the term, cannot tell it now, or the stream was
        deleted), logged and counted, else None (cheap unless the term rises)."""
        terms = self._terms
        if terms is None or not terms.must_check(stream_id, term):
            return None
        refusal = await terms.check(stream_id, term)
        if refusal is not None:
            self._log.refused(rpc, stream_id, refusal.reason, refusal.message, context)
        return refusal

    def _stream_term(self, stream_id: int) -> int:
        state = self._storage.stream_state(stream_id) if stream_id else None
        return int(state.term) if state is not None else 0

    # -- Add -----------------------------------------------------------------------------------

    def _add_rejected(self, request: AddRequest, code: pb.Code, message: str) -> _PendingAdd:
        # One code per entry; an empty batch (an explicit LAC) still gets one code.
        ids = entry_ids(request)
        codes = [code] * max(len(ids), 1)
        response = pb.AddResponse(
            stream_id=request.stream_id,
            request_id=request.request_id,
            bookie_term=self._stream_term(request.stream_id),
            message=message,
        )
        return response, None, codes, ids

    def _start_add(
        self, request: AddRequest, raw: bytes | None, context: Peer | None = None
    ) -> _PendingAdd:
        """Hands one batch to storage; returns its response (to send once `durable` completes),
        the durability future and the codes. `raw` is the batch as received: the storage
        journals it as is instead of serializing the batch again."""
        metrics.ADD_BATCHES.inc()
        reason = malformed_add(request)
        if reason is not None:
            return self._add_rejected(request, BAD_REQUEST, reason)
        if request.recovery:
            audit_recovery_add(request)
        if self.read_only and not request.recovery:
            # Recovery write-backs are still taken, as BookKeeper serves high-priority adds
            # on a read-only bookie: a takeover must be able to finish.
            return self._add_rejected(request, READ_ONLY, self._mode.reason())
        outcome = self._storage.add_batch(request, raw)
        if outcome.refused_overwrite:
            self._log.refused(
                "Add", request.stream_id, OVERWRITE, outcome.refused_overwrite, context
            )
        codes = outcome.codes
        response = pb.AddResponse(
            stream_id=request.stream_id,
            request_id=request.request_id,
            bookie_term=outcome.bookie_term,
            message=outcome.message,
        )
        return response, outcome.durable, codes, outcome.entry_ids or entry_ids(request)

    async def start_add(
        self, request: AddRequest, raw: bytes | None = None, context: Peer | None = None
    ) -> _PendingAdd:
        """Checks one batch against metadata (when its term needs it) and hands it to the
        storage; returns its response (to send once durable, `finish_add`), the durability
        future and the codes. `raw` is the batch as received (journaled as is)."""
        started = self.start_add_now(request, raw, context)
        if started is not None:
            return started
        refusal = await self._refusal("Add", request.stream_id, request.term, context)
        if refusal is not None:
            return self._add_rejected(request, wire_code(refusal.code), refusal.message)
        return self._start_add(request, raw, context)

    def start_add_now(
        self, request: AddRequest, raw: bytes | None = None, context: Peer | None = None
    ) -> _PendingAdd | None:
        """`start_add` without awaiting: None when the batch's term needs a metadata check
        first (a term this bookie has not checked yet; then call `start_add`)."""
        terms = self._terms
        if terms is not None and terms.must_check(request.stream_id, request.term):
            return None
        return self._start_add(request, raw, context)

    def rejected_add(self, request: AddRequest, code: pb.Code, message: str) -> _PendingAdd:
        """Returns the pending answer of a batch refused whole with `code`."""
        return self._add_rejected(request, code, message)

    async def finish_add(self, item: _PendingAdd, *, ranged: bool = False) -> pb.AddResponse:
        """Returns the response of a started batch once it is durable (INTERNAL for every
        entry when the journal failed to sync: nothing about the batch can be promised)."""
        with contextlib.suppress(Exception):  # the group's failure: answer_add reads it
            await self.group_waits.wait(item[1])
        return self.answer_add(item, ranged=ranged)

    def answer_add(self, item: _PendingAdd, *, ranged: bool = False) -> pb.AddResponse:
        """Returns the response of a started batch whose journal group completed: synced, or
        failed (INTERNAL for every entry: nothing about the batch can be promised); counts
        it. `ranged` (data port version 2): consecutive ids are named as a range, and codes
        that agree as one code (an answer costs the same whatever the batch's size); else
        every id and its code."""
        response, durable, codes, ids = item
        failure = durable.exception(0) if durable is not None else None  # done: no wait
        if failure is not None:
            log.error(
                "add.durability_failed",
                stream_id=response.stream_id,
                error=repr(failure),
                exc_info=failure,
            )
            codes = [INTERNAL] * max(len(ids), 1)
            response.message = f"journal failure: {failure!r}"
        self._log.count_add(codes)
        _name_entries(response, ids, codes, ranged)
        return response

    async def add(
        self, request: AddRequest, raw: bytes | None = None, context: Peer | None = None
    ) -> pb.AddResponse:
        """Returns the response to one batch, once durable."""
        return await self.finish_add(await self.start_add(request, raw, context))

    # -- unary requests ---------------------------------------------------------------------

    async def fence(
        self, request: pb.FenceRequest, context: Peer | None = None
    ) -> pb.FenceResponse:
        """Records the term (term rule) and returns what the bookie knows of the stream's end."""
        reason = malformed_fence(request)
        if reason is not None:
            term = self._stream_term(request.stream_id)
            return pb.FenceResponse(code=BAD_REQUEST, bookie_term=term, message=reason)
        refusal = await self._refusal("Fence", request.stream_id, request.term, context)
        if refusal is not None:
            return pb.FenceResponse(
                code=wire_code(refusal.code),
                bookie_term=self._stream_term(request.stream_id),
                message=refusal.message,
            )
        outcome = self._storage.fence(request.stream_id, request.term)
        await _await_durable(outcome.durable)
        return pb.FenceResponse(
            code=outcome.code,
            bookie_term=outcome.bookie_term,
            lac=outcome.lac,
            lafr=outcome.lafr,
            last_entry_id=outcome.last_entry_id,
            limbo=outcome.limbo,
            message=outcome.message,
        )

    async def read(self, request: pb.ReadRequest, context: Peer | None = None) -> pb.ReadResponse:
        """Returns one entry (a recovery read when the request carries a term)."""
        reason = malformed_read(request)
        if reason is not None:
            return pb.ReadResponse(code=BAD_REQUEST, message=reason)
        if request.term:  # a recovery read
            refusal = await self._refusal("Read", request.stream_id, request.term, context)
            if refusal is not None:
                self._log.count_read(refusal.code, 1)
                return pb.ReadResponse(
                    code=wire_code(refusal.code),
                    lac=-1,
                    bookie_term=self._stream_term(request.stream_id),
                    message=refusal.message,
                )
        outcome = self._storage.read(request.stream_id, request.entry_id, request.term)
        await _await_durable(outcome.durable)
        response = pb.ReadResponse(
            code=outcome.code,
            lac=outcome.lac,
            bookie_term=outcome.bookie_term,
            first_entry_id=outcome.first_entry_id,
            message=outcome.message,
        )
        if outcome.entry is not None:
            response.entry.CopyFrom(outcome.entry)
        self._log.count_read(outcome.code, 1)
        return response

    async def read_lac(
        self, request: pb.ReadLacRequest, context: Peer | None = None
    ) -> pb.ReadLacResponse:
        """Returns the stream's LAC as soon as it is above `known_lac`, or when the wait
        (`min(timeout_ms, read_lac_max_wait_ms)`) ends."""
        reason = malformed_read_lac(request)
        if reason is not None:
            return pb.ReadLacResponse(code=BAD_REQUEST, message=reason)
        stream_id = request.stream_id
        wait_s = min(request.timeout_ms, self._config.read_lac_max_wait_ms) / 1000.0
        deadline = self._loop.time() + wait_s
        while True:
            found = self._storage.lac(stream_id)
            if found is not None and found[0] > request.known_lac:
                break
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                break
            if self._lac_polls.full:
                return pb.ReadLacResponse(code=TOO_BUSY, message="too many ReadLac long polls")
            await self._lac_polls.wait(stream_id, remaining)
        if found is None:
            # Never heard of the stream, even after waiting: an explicit negative (a stream in
            # limbo is known to the storage, so it never lands here).
            return pb.ReadLacResponse(code=NO_SUCH_STREAM, lac=-1, lafr=-1)
        return pb.ReadLacResponse(code=OK, lac=found[0], lafr=found[1])

    async def truncate(
        self, request: pb.TruncateRequest, context: Peer | None = None
    ) -> pb.TruncateResponse:
        """Drops every entry above `after_entry_id` (term rule applies; a late Truncate of
        the stream's term, below the point already applied, is refused and drops nothing)."""
        reason = malformed_truncate(request)
        code = BAD_REQUEST if reason is not None else READ_ONLY if self.read_only else OK
        if code != OK:
            term = self._stream_term(request.stream_id)
            message = reason or self._mode.reason()
            return pb.TruncateResponse(code=code, bookie_term=term, message=message)
        refusal = await self._refusal("Truncate", request.stream_id, request.term, context)
        if refusal is not None:
            return pb.TruncateResponse(
                code=wire_code(refusal.code),
                bookie_term=self._stream_term(request.stream_id),
                message=refusal.message,
            )
        outcome = self._storage.truncate(request.stream_id, request.term, request.after_entry_id)
        await _await_durable(outcome.durable)
        return pb.TruncateResponse(
            code=outcome.code,
            bookie_term=outcome.bookie_term,
            message=outcome.message,
        )

    async def trim(self, request: pb.TrimRequest, context: Peer | None = None) -> pb.TrimResponse:
        """Drops every entry below `before_entry_id` (allowed when read-only: it frees space),
        never beyond metadata's first retained entry."""
        reason = malformed_trim(request)
        if reason is not None:
            return pb.TrimResponse(code=BAD_REQUEST, message=reason)
        if self._terms is not None:
            refusal = await self._terms.trim_refusal(request.stream_id, request.before_entry_id)
            if refusal is not None:
                self._log.refused(
                    "Trim", request.stream_id, refusal.reason, refusal.message, context
                )
                state = self._storage.stream_state(request.stream_id)
                return pb.TrimResponse(
                    code=wire_code(refusal.code),
                    first_entry_id=state.first_entry_id if state is not None else 0,
                    message=refusal.message,
                )
        outcome = self._storage.trim(request.stream_id, request.before_entry_id)
        await _await_durable(outcome.durable)
        return pb.TrimResponse(
            code=outcome.code,
            first_entry_id=outcome.first_entry_id,
            message=outcome.message,
        )

    async def stream_state(
        self, request: pb.StreamStateRequest, context: Peer | None = None
    ) -> pb.StreamStateResponse:
        """Returns the bookie's state for one stream (NO_SUCH_STREAM when it has none)."""
        reason = malformed_stream_state(request)
        if reason is not None:
            return pb.StreamStateResponse(code=BAD_REQUEST, message=reason)
        state = self._storage.stream_state(request.stream_id)
        if state is None:
            return pb.StreamStateResponse(
                code=NO_SUCH_STREAM, lac=-1, lafr=-1, last_entry_id=-1, first_entry_id=0
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

    async def info(self, request: pb.InfoRequest, context: Peer | None = None) -> pb.InfoResponse:
        """Returns who the bookie is, its disk state and what it found at start."""
        disk = self._mode.disk_status
        return pb.InfoResponse(
            bookie_id=self._config.bookie_id,
            instance_id=self._instance_id,
            address=self._config.listen,
            read_only=self.read_only,
            free_bytes=disk.free_bytes if disk else 0,
            total_bytes=disk.total_bytes if disk else 0,
            journal_write_data=self._config.journal_write_data,
            stream_count=sum(1 for _ in self._storage.stream_ids()),
            version=VERSION,
            unclean_start=self._start_report.unclean_start,
            replayed_records=self._start_report.replayed_records,
            replayed_entries=self._start_report.replayed_entries,
        )

    # -- ReadRange ------------------------------------------------------------------------

    def read_range(
        self, request: pb.ReadRangeRequest, *, raw: bool = False
    ) -> Iterator[tuple[pb.ReadRangeResponse, list[Any] | FramedEntries]]:
        """Yields the batches of [first_entry_id, last_entry_id], each a response head (code,
        LAC, first retained entry when TRIMMED) and its entries (framed with `raw`), in
        batches of at most `max_batch_bytes`; the last one carries the code that ended the
        range. A malformed request gives one BAD_REQUEST head."""
        reason = malformed_read_range(request)
        if reason is not None:
            yield pb.ReadRangeResponse(code=BAD_REQUEST, message=reason), []
            return
        cap = self._config.grpc_max_message_bytes - _READ_RANGE_ENVELOPE_BYTES
        max_bytes = min(request.max_batch_bytes or self._config.read_range_batch_bytes, cap)
        found = self._storage.lac(request.stream_id)
        lac = found[0] if found is not None else -1
        batches = self._storage.read_range(
            request.stream_id,
            request.first_entry_id,
            request.last_entry_id,
            max_bytes,
            raw=raw,
        )
        for code, records in batches:
            head = pb.ReadRangeResponse(code=code, lac=lac)
            if code == TRIMMED:
                state = self._storage.stream_state(request.stream_id)
                head.first_entry_id = state.first_entry_id if state else 0
            self._log.count_read(code, len(records))
            yield head, records
