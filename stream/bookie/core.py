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
import collections
import concurrent.futures
import importlib.metadata
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from stream.bookie import metrics
from stream.bookie.access import ANONYMOUS, CALLER, audit_recovery_add
from stream.bookie.config import BookieConfig
from stream.bookie.disk import DiskStatus
from stream.bookie.terms import OVERWRITE, MetadataTerms, Refusal
from stream.wire import bookie_pb2 as pb

log = structlog.get_logger(__name__)

OK = pb.OK
BAD_REQUEST = pb.BAD_REQUEST
INTERNAL = pb.INTERNAL
READ_ONLY = pb.READ_ONLY
TOO_BUSY = pb.TOO_BUSY
NO_SUCH_STREAM = pb.NO_SUCH_STREAM
TRIMMED = pb.TRIMMED

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

    def add_batch(self, request: pb.AddRequest, raw: bytes | None = None) -> Any: ...
    def fence(self, stream_id: int, term: int) -> Any: ...
    def read(self, stream_id: int, entry_id: int, term: int = 0) -> Any: ...
    def read_range(
        self, stream_id: int, first: int, last: int, max_batch_bytes: int, *, raw: bool = False
    ) -> Iterator[tuple[int, list[Any]]]: ...
    def lac(self, stream_id: int) -> tuple[int, int] | None: ...
    def truncate(self, stream_id: int, term: int, after_entry_id: int) -> Any: ...
    def trim(self, stream_id: int, before_entry_id: int) -> Any: ...
    def stream_state(self, stream_id: int) -> Any: ...
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


# An add batch on its way: the response, the journal future it waits for, its codes.
_PendingAdd = tuple[pb.AddResponse, "concurrent.futures.Future[Any] | None", list[int]]
_CODE_NAME = {value: name for name, value in pb.Code.items()}


def _code_name(code: int) -> str:
    return _CODE_NAME.get(code, str(code))


async def _await_durable(durable: concurrent.futures.Future[Any] | None) -> None:
    """Returns once `durable` (a journal fsync future, or None) completed; raises its error."""
    if durable is None:
        return
    if durable.done():
        durable.result()
        return
    await asyncio.wrap_future(durable)


class Peer(Protocol):
    """Who sent a request, for the refusal log when the access interceptor did not say (a
    gRPC context)."""

    def peer(self) -> str: ...


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
        self._disk = disk_status
        self._draining = False
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        # Long polls waiting for a stream's LAC to move: stream id -> their futures.
        self._lac_waiters: dict[int, set[asyncio.Future[None]]] = {}
        self._lac_waiter_count = 0
        storage.on_lac_advanced = self.notify_lac_advanced
        self._add_entries_ok = metrics.ADD_ENTRIES.labels(code="OK")
        self._request_counters: dict[tuple[str, int], Any] = {}
        self._read_counters: dict[int, Any] = {}

    # -- state set by the process ---------------------------------------------------------

    @property
    def disk_status(self) -> DiskStatus | None:
        """Returns the latest disk check (None before the first)."""
        return self._disk

    @property
    def read_only(self) -> bool:
        """Read-only: the disk is nearly full, or the bookie is being drained (decommission:
        writers move their fragments elsewhere; reads and recovery adds are still served)."""
        return self._draining or (self._disk is not None and self._disk.read_only)

    @property
    def draining(self) -> bool:
        return self._draining

    def _read_only_reason(self) -> str:
        return (
            "bookie is read-only (draining)"
            if self._draining
            else "bookie is read-only (disk full)"
        )

    def set_draining(self, draining: bool) -> None:
        """Switches drain mode (`/bookies/draining/<bookie_id>` exists)."""
        if draining != self._draining:
            log.warning("bookie.draining" if draining else "bookie.drain_cancelled")
        self._draining = draining
        metrics.READ_ONLY.set(1 if self.read_only else 0)

    def set_disk_status(self, status: DiskStatus) -> None:
        """Records the latest disk check; read-only mode follows it."""
        if (self._disk is not None and self._disk.read_only) != status.read_only:
            log.warning(
                "bookie.read_only" if status.read_only else "bookie.writable",
                fullest_dir=status.fullest_dir,
                used_fraction=round(status.used_fraction, 4),
                threshold=self._config.disk_usage_threshold,
            )
        self._disk = status
        metrics.READ_ONLY.set(1 if self.read_only else 0)

    def notify_lac_advanced(self, stream_id: int, lac: int) -> None:
        """Wakes the long polls of `stream_id` (storage calls this when its LAC moves; any
        thread may call it)."""
        if threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self._wake_lac_waiters, stream_id)
        else:
            self._wake_lac_waiters(stream_id)

    def _wake_lac_waiters(self, stream_id: int) -> None:
        waiters = self._lac_waiters.pop(stream_id, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def count(self, rpc: str, code: int) -> None:
        """Counts one answer of `rpc` with `code`."""
        counter = self._request_counters.get((rpc, code))
        if counter is None:
            counter = metrics.REQUESTS.labels(rpc=rpc, code=_code_name(code))
            self._request_counters[(rpc, code)] = counter
        counter.inc()

    def _count_read(self, code: int, entries: int) -> None:
        counter = self._read_counters.get(code)
        if counter is None:
            counter = self._read_counters[code] = metrics.READ_ENTRIES.labels(code=_code_name(code))
        counter.inc(entries)

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
            self._log_refusal(rpc, stream_id, refusal.reason, refusal.message, context)
        return refusal

    def _log_refusal(
        self, rpc: str, stream_id: int, reason: str, message: str, context: Any
    ) -> None:
        """One event and one count per refused request, naming who asked (the principal the
        access interceptor found; `anonymous` without mutual TLS)."""
        caller = CALLER.get()
        principal = caller.principal if caller is not None else ANONYMOUS
        peer = caller.peer if caller is not None else context.peer() if context else None
        log.warning(
            "bookie.request_refused",
            rpc=rpc,
            stream_id=stream_id,
            reason=reason,
            message=message,
            principal=principal,
            peer=peer,
        )
        metrics.REFUSED.labels(rpc=rpc, reason=reason).inc()
        metrics.AUDIT_EVENTS.labels(action="refused", principal=principal).inc()

    def _stream_term(self, stream_id: int) -> int:
        state = self._storage.stream_state(stream_id) if stream_id else None
        return int(state.term) if state is not None else 0

    # -- Add -----------------------------------------------------------------------------------

    @staticmethod
    def _malformed_add(request: pb.AddRequest) -> str | None:
        """Returns why an add batch is malformed as a whole, or None (entries are checked by
        the storage engine)."""
        if request.stream_id == 0:
            return "stream_id 0 is not a stream"
        if request.term == 0:
            return "an add needs a term >= 1"
        if request.lac < -1 or request.lafr < -1:
            return f"lac {request.lac} / lafr {request.lafr} below -1"
        return None

    def _add_rejected(self, request: pb.AddRequest, code: int, message: str) -> _PendingAdd:
        # One code per entry; an empty batch (an explicit LAC) still gets one code.
        codes = [code] * max(len(request.entries), 1)
        response = pb.AddResponse(
            stream_id=request.stream_id,
            request_id=request.request_id,
            bookie_term=self._stream_term(request.stream_id),
            message=message,
        )
        response.entry_ids.extend([e.entry_id for e in request.entries])
        response.codes.extend(codes)
        return response, None, codes

    def _start_add(
        self, request: pb.AddRequest, raw: bytes | None, context: Any = None
    ) -> _PendingAdd:
        """Hands one batch to storage; returns its response (to send once `durable` completes),
        the durability future and the codes. `raw` is the batch as received: the storage
        journals it as is instead of serializing the batch again."""
        metrics.ADD_BATCHES.inc()
        reason = self._malformed_add(request)
        if reason is not None:
            return self._add_rejected(request, BAD_REQUEST, reason)
        if request.recovery:
            audit_recovery_add(request)
        if self.read_only and not request.recovery:
            # Recovery write-backs are still taken, as BookKeeper serves high-priority adds
            # on a read-only bookie: a takeover must be able to finish.
            return self._add_rejected(request, READ_ONLY, self._read_only_reason())
        outcome = self._storage.add_batch(request, raw)
        if outcome.refused_overwrite:
            self._log_refusal(
                "Add", request.stream_id, OVERWRITE, outcome.refused_overwrite, context
            )
        codes: list[int] = outcome.codes
        response = pb.AddResponse(
            stream_id=request.stream_id,
            request_id=request.request_id,
            bookie_term=outcome.bookie_term,
            message=outcome.message,
        )
        # Whole-array extends from lists the storage built anyway: no per-entry Python here.
        if outcome.entry_ids or not request.entries:
            response.entry_ids.extend(outcome.entry_ids)
        else:
            response.entry_ids.extend([e.entry_id for e in request.entries])
        response.codes.extend(codes)
        return response, outcome.durable, codes

    async def start_add(
        self, request: pb.AddRequest, raw: bytes | None = None, context: Peer | None = None
    ) -> _PendingAdd:
        """Checks one batch against metadata (when its term needs it) and hands it to the
        storage; returns its response (to send once durable, `finish_add`), the durability
        future and the codes. `raw` is the batch as received (journaled as is)."""
        terms = self._terms  # a sync test first: no coroutine per batch
        refusal = (
            await self._refusal("Add", request.stream_id, request.term, context)
            if terms is not None and terms.must_check(request.stream_id, request.term)
            else None
        )
        if refusal is not None:
            return self._add_rejected(request, refusal.code, refusal.message)
        return self._start_add(request, raw, context)

    def rejected_add(self, request: pb.AddRequest, code: int, message: str) -> _PendingAdd:
        """Returns the pending answer of a batch refused whole with `code`."""
        return self._add_rejected(request, code, message)

    async def finish_add(self, item: _PendingAdd) -> pb.AddResponse:
        """Returns the response of a started batch once it is durable (INTERNAL for every
        entry when the journal failed to sync: nothing about the batch can be promised)."""
        response, durable, codes = item
        try:
            await _await_durable(durable)
        except Exception as e:
            log.error("add.durability_failed", stream_id=response.stream_id, error=repr(e))
            codes = [INTERNAL] * max(len(response.entry_ids), 1)
            del response.codes[:]
            response.codes.extend(codes)
            response.message = f"journal failure: {e!r}"
        self._count_add(codes)
        return response

    async def add(
        self, request: pb.AddRequest, raw: bytes | None = None, context: Peer | None = None
    ) -> pb.AddResponse:
        """Returns the response to one batch, once durable."""
        return await self.finish_add(await self.start_add(request, raw, context))

    def _count_add(self, codes: list[int]) -> None:
        n = len(codes)
        if n and codes.count(OK) == n:
            self._add_entries_ok.inc(n)
        else:
            for code, count in collections.Counter(codes).items():
                metrics.ADD_ENTRIES.labels(code=_code_name(code)).inc(count)
        self.count("Add", codes[0] if n else OK)

    # -- unary requests ---------------------------------------------------------------------

    async def fence(
        self, request: pb.FenceRequest, context: Peer | None = None
    ) -> pb.FenceResponse:
        """Records the term (term rule) and returns what the bookie knows of the stream's end."""
        if request.stream_id == 0 or request.term == 0:
            return pb.FenceResponse(
                code=BAD_REQUEST,
                bookie_term=self._stream_term(request.stream_id),
                message="Fence needs a stream_id and a term >= 1",
            )
        refusal = await self._refusal("Fence", request.stream_id, request.term, context)
        if refusal is not None:
            return pb.FenceResponse(
                code=refusal.code,
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
        if request.stream_id == 0 or request.entry_id < 0:
            return pb.ReadResponse(
                code=BAD_REQUEST, message="Read needs a stream_id and an entry_id >= 0"
            )
        if request.term:  # a recovery read
            refusal = await self._refusal("Read", request.stream_id, request.term, context)
            if refusal is not None:
                self._count_read(refusal.code, 1)
                return pb.ReadResponse(
                    code=refusal.code,
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
        self._count_read(outcome.code, 1)
        return response

    async def read_lac(
        self, request: pb.ReadLacRequest, context: Peer | None = None
    ) -> pb.ReadLacResponse:
        """Returns the stream's LAC as soon as it is above `known_lac`, or when the wait
        (`min(timeout_ms, read_lac_max_wait_ms)`) ends."""
        stream_id = request.stream_id
        if stream_id == 0 or request.known_lac < -1:
            return pb.ReadLacResponse(
                code=BAD_REQUEST, message="ReadLac needs a stream_id and a known_lac >= -1"
            )
        wait_s = min(request.timeout_ms, self._config.read_lac_max_wait_ms) / 1000.0
        deadline = self._loop.time() + wait_s
        while True:
            found = self._storage.lac(stream_id)
            if found is not None and found[0] > request.known_lac:
                break
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                break
            if self._lac_waiter_count >= MAX_LAC_WAITERS:
                return pb.ReadLacResponse(code=TOO_BUSY, message="too many ReadLac long polls")
            await self._wait_lac(stream_id, remaining)
        if found is None:
            # Never heard of the stream, even after waiting: an explicit negative (a stream in
            # limbo is known to the storage, so it never lands here).
            return pb.ReadLacResponse(code=NO_SUCH_STREAM, lac=-1, lafr=-1)
        return pb.ReadLacResponse(code=OK, lac=found[0], lafr=found[1])

    async def _wait_lac(self, stream_id: int, timeout_s: float) -> None:
        """Returns when the LAC of `stream_id` may have moved, or after `timeout_s`."""
        fut: asyncio.Future[None] = self._loop.create_future()
        waiters = self._lac_waiters.setdefault(stream_id, set())
        waiters.add(fut)
        self._lac_waiter_count += 1
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            self._lac_waiter_count -= 1
            # The set may have been popped (and replaced) by a wake-up meanwhile.
            current = self._lac_waiters.get(stream_id)
            if current is not None:
                current.discard(fut)
                if not current:
                    del self._lac_waiters[stream_id]

    async def truncate(
        self, request: pb.TruncateRequest, context: Peer | None = None
    ) -> pb.TruncateResponse:
        """Drops every entry above `after_entry_id` (term rule applies; a late Truncate of
        the stream's term, below the point already applied, is refused and drops nothing)."""
        if request.stream_id == 0 or request.term == 0 or request.after_entry_id < -1:
            return pb.TruncateResponse(
                code=BAD_REQUEST,
                bookie_term=self._stream_term(request.stream_id),
                message="Truncate needs a stream_id, a term >= 1 and an after_entry_id >= -1",
            )
        if self.read_only:
            return pb.TruncateResponse(
                code=READ_ONLY,
                bookie_term=self._stream_term(request.stream_id),
                message=self._read_only_reason(),
            )
        refusal = await self._refusal("Truncate", request.stream_id, request.term, context)
        if refusal is not None:
            return pb.TruncateResponse(
                code=refusal.code,
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
        if request.stream_id == 0 or request.before_entry_id < 0:
            return pb.TrimResponse(
                code=BAD_REQUEST, message="Trim needs a stream_id and a before_entry_id >= 0"
            )
        if self._terms is not None:
            refusal = await self._terms.trim_refusal(request.stream_id, request.before_entry_id)
            if refusal is not None:
                self._log_refusal(
                    "Trim", request.stream_id, refusal.reason, refusal.message, context
                )
                state = self._storage.stream_state(request.stream_id)
                return pb.TrimResponse(
                    code=refusal.code,
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
        if request.stream_id == 0:
            return pb.StreamStateResponse(code=BAD_REQUEST, message="stream_id 0 is not a stream")
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
        disk = self._disk
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
    ) -> Iterator[tuple[pb.ReadRangeResponse, list[Any]]]:
        """Yields the batches of [first_entry_id, last_entry_id], each a response head (code,
        LAC, first retained entry when TRIMMED) and its entries (serialized with `raw`), in
        batches of at most `max_batch_bytes`; the last one carries the code that ended the
        range. A malformed request gives one BAD_REQUEST head."""
        if (
            request.stream_id == 0
            or request.first_entry_id < 0
            or request.last_entry_id < request.first_entry_id
        ):
            yield (
                pb.ReadRangeResponse(
                    code=BAD_REQUEST,
                    message="ReadRange needs a stream_id and 0 <= first_entry_id <= last_entry_id",
                ),
                [],
            )
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
            self._count_read(code, len(records))
            yield head, records
