"""The public synchronous API of docs/design.md §5: `StreamClient` and its writers and readers.

A thin facade: one asyncio loop in a background thread runs the asyncio core (writer, reader,
recovery) over the gRPC transport and the ZooKeeper metadata port. Appends cross from the
caller's thread through a thread-safe deque (the loop is woken only when idle); reads come back
in chunks, fetched ahead a few at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import getpass
import os
import random
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from stream.client.answer_buffers import AnswerBuffers
from stream.client.answers import answer_or_none
from stream.client.attributes import HeadersArg
from stream.client.cursor import (
    AsyncCursor,
    AutoCommitter,
    Cursor,
    check_interval,
    cursor_lags,
)
from stream.client.entry import Entry, EntryColumns
from stream.client.grpc_transport import GrpcTransport
from stream.client.info import BookieStatus, FragmentInfo, StreamInfo
from stream.client.options import ReaderOptions, WriterOptions
from stream.client.ports import WallClock
from stream.client.reader import AsyncStreamReader
from stream.client.stream_admin import delete_stream, trim_stream
from stream.client.zk_metadata import ZkMetadata
from stream.clock import SystemClock
from stream.errors import (
    AppendTimeoutError,
    InvalidArgumentError,
    NotEnoughBookiesError,
    StreamError,
)
from stream.logs import get_logger
from stream.metadata import (
    AcceptedLoss,
    CursorLag,
    MetadataSession,
    RetentionPolicy,
    StreamMeta,
    StreamState,
)
from stream.metadata.model import validate_stream_id, validate_stream_name
from stream.protocol import (
    Code,
    QuorumConfig,
    choose_ensemble,
    journal_required,
    recovery_waits_for,
)
from stream.security.tls import TLSConfig

if TYPE_CHECKING:
    from stream.client.accept_loss import LossSurvey
    from stream.client.writer import AsyncStreamWriter

log = get_logger(__name__)

T = TypeVar("T")
Chunk = TypeVar("Chunk")

# Chunks of entries a reader fetches ahead of the application.
_READ_PREFETCH_CHUNKS = 4
_OK = int(Code.OK)  # an int: the answers carry the wire's own Code type
_BOOKIE_CALL_TIMEOUT_S = 5.0


class _LoopThread:
    """An asyncio event loop running in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()
        self._ready.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Runs `coro` on the loop and returns its result (raising its exception)."""
        if threading.current_thread() is self.thread:
            raise InvalidArgumentError("blocking client call made on the client's own loop")
        future = self.submit(coro)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return

        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.run(shutdown(), timeout_s=5)
        except Exception:  # stopping anyway
            log.debug("client.loop_shutdown_incomplete", exc_info=True)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()


class StreamClient:
    """A connection to one Streamkeeper cluster (ZooKeeper metadata + bookies). Thread-safe.
    Build it with `StreamClient.connect("host:port/root")`; `close()` it when done."""

    def __init__(
        self,
        session: MetadataSession,
        *,
        writer_options: WriterOptions | None = None,
        reader_options: ReaderOptions | None = None,
        seed: int | None = None,
        tls: TLSConfig | None = None,
        clock: WallClock | None = None,
    ) -> None:
        """`tls`: reach the bookies over TLS with these files (None: plaintext). `clock` stamps
        the entries this client's writers append (default: the system's wall clock; tests
        inject skewed ones)."""
        self._session = session
        self._tls = tls
        self._metadata = ZkMetadata(session)
        self._writer_options = writer_options or WriterOptions()
        self._reader_options = reader_options or ReaderOptions()
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._clock = clock or SystemClock()
        self._loop = _LoopThread("streamkeeper-client")
        self._transport = self._loop.run(self._make_transport())
        # The payload columns its readers build from large answers, reused (on its loop).
        self._columns = AnswerBuffers()
        self._writers: set[StreamWriter] = set()
        self._closed = False

    async def _make_transport(self) -> GrpcTransport:
        return GrpcTransport(
            self._metadata.bookie_address,
            tls=self._tls,
            resolve_data=self._metadata.bookie_data_address,
            # The defaults of the calls that do not say; writers and readers pass their
            # options' `data_port`.
            data_adds=self._writer_options.data_port,
            # Over TLS, gRPC's own TLS costs less per byte than the data port's (Python's
            # ssl encrypts into a memory buffer, copied out again): ranges stay on gRPC there,
            # whatever a reader's options say.
            data_reads=self._reader_options.data_port and self._tls is None,
        )

    @classmethod
    def connect(
        cls,
        connect_string: str,
        *,
        timeout_s: float = 10.0,
        writer_options: WriterOptions | None = None,
        reader_options: ReaderOptions | None = None,
        tls: TLSConfig | None = None,
        metadata_auth_file: str | Path | None = None,
        clock: WallClock | None = None,
    ) -> StreamClient:
        """Returns a client connected to `HOSTS[/ROOT]` (ZooKeeper hosts and the metadata
        root, default `/streamkeeper`). `tls`: the CA, certificate and key for bookies that
        serve TLS (their files are read, and loose key permissions refused, before
        connecting). `metadata_auth_file`: authenticate to ZooKeeper as its identity
        (docs/operations.md, Metadata authentication)."""
        if tls is not None:
            tls.load()
        session = MetadataSession.connect(
            connect_string, timeout_s=timeout_s, auth_file=metadata_auth_file
        )
        try:
            return cls(
                session,
                writer_options=writer_options,
                reader_options=reader_options,
                tls=tls,
                clock=clock,
            )
        except BaseException:
            session.close()
            raise

    def _child_rng(self) -> random.Random:
        with self._rng_lock:
            return random.Random(self._rng.getrandbits(64))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise StreamError("client is closed")
        return self._loop.run(coro)

    # ------------------------------------------------------------------ streams

    def create_stream(
        self,
        name: str,
        *,
        ensemble: int = 3,
        write_quorum: int = 3,
        ack_quorum: int = 2,
        fragment_max_entries: int = 100_000,
        fragment_max_bytes: int = 64 << 20,
        fragment_max_age_s: float | None = None,
        retention: RetentionPolicy | None = None,
        allow_fewer_bookies: bool = False,
    ) -> StreamMeta:
        """Creates stream `name` and returns its metadata. Everything is checked before
        anything is written (`InvalidArgumentError`); an existing stream with the same
        configuration is returned as is, one with another raises `StreamExistsError`. Fewer
        writable bookies registered than `ensemble` raise `NotEnoughBookiesError` (the first
        append could only wait), unless `allow_fewer_bookies` (bookies added later)."""

        async def create() -> StreamMeta:
            if not allow_fewer_bookies:
                quorum = QuorumConfig(ensemble, write_quorum, ack_quorum)
                await self._check_enough_bookies(validate_stream_name(name), quorum)
            return await self._metadata.create_stream(
                name,
                ensemble,
                write_quorum,
                ack_quorum,
                fragment_max_entries,
                fragment_max_bytes,
                fragment_max_age_s,
                retention,
            )

        return self._run(create())

    async def _check_enough_bookies(self, name: str, quorum: QuorumConfig) -> None:
        """Raises `NotEnoughBookiesError` unless the registered bookies can hold an ensemble:
        placement's own rule (writable; journal on for AQ = 1) decides."""
        candidates = await self._metadata.available_bookies()
        journal = journal_required(quorum.ack_quorum)
        try:
            choose_ensemble(candidates, quorum.ensemble, random.Random(0), needs_journal=journal)
        except NotEnoughBookiesError as exc:
            raise NotEnoughBookiesError(
                f"{exc.message}; nothing was created (allow_fewer_bookies=True, or "
                "streamctl create --allow-fewer-bookies, creates it for bookies added later)",
                stream=name,
                **exc.context,
            ) from None

    def list_streams(self) -> list[str]:
        """Returns every stream name, sorted."""
        return self._run(self._metadata.list_streams())

    def open_writer(
        self,
        name: str,
        reengage: bool = False,
        is_leader: Callable[[], bool] | None = None,
        *,
        options: WriterOptions | None = None,
        producer_id: str | None = None,
    ) -> StreamWriter:
        """Takes stream `name` over with a new term (recovering the previous term's end) and
        returns its writer. With `reengage`, a writer that another took over from takes over
        again (when `is_leader()`, called on the client's loop thread, still says so). With
        `producer_id` it is an idempotent producer (docs/design.md §11): `last_sequence` says
        where that producer stands, and every append carries a `sequence`."""
        # The writer's modules are imported by the first writer: a reader's process (a Spark
        # task's) does not pay for them.
        from stream.client.recovery import WriterIdentity
        from stream.client.writer import AsyncStreamWriter

        validate_stream_name(name)
        identity = WriterIdentity(
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
            socket.gethostname(),
            os.getpid(),
        )
        core = AsyncStreamWriter(
            name,
            transport=self._transport,
            metadata=self._metadata,
            clock=self._clock,
            rng=self._child_rng(),
            options=options or self._writer_options,
            identity=identity,
            reengage=reengage,
            is_leader=is_leader,
            producer_id=producer_id,
        )
        self._run(core.open())
        writer = StreamWriter(self, core)
        self._writers.add(writer)
        return writer

    def open_reader(
        self,
        name: str,
        *,
        options: ReaderOptions | None = None,
        stream_id: int | None = None,
        known_lac: int | None = None,
    ) -> StreamReader:
        """Returns a reader of stream `name`; raises `StreamNotFoundError`. `stream_id` (the
        stream's id when the caller found it, `stream_info(name).stream_id`) opens that very
        stream without looking the name up (two ZooKeeper reads less): when it was deleted
        since, `StreamNotFoundError`, also if a stream of the same name was created
        meanwhile. `known_lac` (with `stream_id`; `stream_info(name).lac`, read before this
        call): reads that end at or below it skip the metadata and LAC reads before them (a
        planner that split a stream up to its LAC hands both on to each part's reader)."""
        validate_stream_name(name)
        if stream_id is not None:
            validate_stream_id(stream_id)
        core = AsyncStreamReader(
            name,
            transport=self._transport,
            metadata=self._metadata,
            rng=self._child_rng(),
            options=options or self._reader_options,
            columns=self._columns,
        )
        self._run(core.open(stream_id, known_lac))
        return StreamReader(self, core)

    def _async_reader(self, name: str) -> AsyncStreamReader:
        return AsyncStreamReader(
            name,
            transport=self._transport,
            metadata=self._metadata,
            rng=self._child_rng(),
            options=self._reader_options,
            columns=self._columns,
        )

    def cursor(self, stream: str, name: str) -> Cursor:
        """Returns durable cursor `name` of `stream` (several per stream): its `position` is
        kept in metadata by `commit`, and `reader.tail(cursor=...)` resumes after it. Raises
        `StreamNotFoundError`; the cursor itself exists from its first commit."""
        validate_stream_name(stream)
        core = AsyncCursor(
            stream,
            name,
            metadata=self._metadata,
            make_reader=lambda: self._async_reader(stream),
        )
        self._run(core.open())
        return Cursor(self._run, core)

    def cursors(self, stream: str) -> dict[str, CursorLag]:
        """Returns every durable cursor of `stream` by name: its position, when it was
        committed, and its lag behind the LAC."""

        async def lags() -> dict[str, CursorLag]:
            reader = self._async_reader(stream)
            await reader.open()
            return await cursor_lags(self._metadata, reader, await reader.lac())

        return self._run(lags())

    def stream_info(self, name: str, *, brief: bool = False) -> StreamInfo:
        """Returns the stream's term, state, LAC, first retained entry and fragments, its
        writer, cursors and ensemble bookies' states. `brief`: only what a reader plans
        with (the writer, cursors and bookie states left empty), which spares the metadata
        reads of the writer, the cursors and the bookie registrations and a call to each
        bookie of the last ensemble: a query planner asks for every stream and batch."""
        return self._run(self._stream_info(name, brief))

    async def _stream_info(self, name: str, brief: bool = False) -> StreamInfo:
        reader = self._async_reader(name)
        await reader.open()
        meta, fragments = reader.meta, reader.fragments
        lac = await reader.lac()
        writer = None if brief else await self._metadata.get_writer(meta.id)
        cursors = {} if brief else await cursor_lags(self._metadata, reader, lac)
        shown = []
        for index, fragment in enumerate(fragments):
            last = fragment.last_entry_id
            if last is None and index + 1 < len(fragments):
                last = fragments[index + 1].first_entry_id - 1
            shown.append(
                FragmentInfo(
                    fragment.first_entry_id,
                    last,
                    list(fragment.ensemble),
                    fragment.bytes,
                    fragment.first_timestamp_ms,
                    fragment.last_timestamp_ms,
                )
            )
        bookies = (
            []
            if brief
            else await self._ensemble_status(meta.id, fragments[-1].ensemble if fragments else ())
        )
        waiting_for = None
        if meta.state is StreamState.IN_RECOVERY and not brief:
            waiting_for = recovery_waits_for(
                meta.quorum,
                [b.bookie_id for b in bookies],
                down={b.bookie_id for b in bookies if b.state == "down"},
                limbo={b.bookie_id for b in bookies if b.limbo},
                writer=None if writer is None else writer.writer_id,
            )
        return StreamInfo(
            name=meta.name,
            stream_id=meta.id,
            term=meta.term,
            state=str(meta.state),
            lac=lac,
            first_entry_id=meta.first_entry_id,
            ensemble_size=meta.ensemble,
            write_quorum=meta.write_quorum,
            ack_quorum=meta.ack_quorum,
            fragments=shown,
            writer=None if writer is None else writer.writer_id,
            term_history=[(term, first) for term, first in meta.term_history],
            accepted_losses=list(meta.accepted_losses),
            bookies=bookies,
            waiting_for=waiting_for,
            cursors=cursors,
        )

    async def _ensemble_status(self, stream_id: int, ensemble: Sequence[str]) -> list[BookieStatus]:
        """Each bookie's registration and, from those registered, whether it holds the stream
        in limbo (a term-less `StreamState`: nothing changes)."""
        registered = {c.bookie_id: c for c in await self._metadata.available_bookies()}

        async def limbo(bookie_id: str) -> bool | None:
            if bookie_id not in registered:
                return None
            answer = await answer_or_none(
                self._transport.stream_state(bookie_id, stream_id, timeout_s=_BOOKIE_CALL_TIMEOUT_S)
            )
            if answer is None:
                return None  # registered, not answering (killed, its session not gone yet)
            return bool(answer.limbo) if answer.code == _OK else False

        limbos = await asyncio.gather(*(limbo(b) for b in ensemble))
        return [
            BookieStatus(
                b,
                "down"
                if b not in registered
                else ("available" if registered[b].writable else "read-only"),
                in_limbo,
            )
            for b, in_limbo in zip(ensemble, limbos, strict=True)
        ]

    def set_retention(self, name: str, policy: RetentionPolicy | None) -> None:
        """Stores the stream's retention policy (None: keep everything)."""
        if policy is not None and not isinstance(policy, RetentionPolicy):
            raise InvalidArgumentError("policy must be a RetentionPolicy or None", stream=name)

        async def apply() -> None:
            meta, _ = await self._metadata.get_stream(name)
            await self._metadata.set_retention(meta.id, policy)

        self._run(apply())

    def trim(self, name: str, before_entry_id: int) -> int:
        """Deletes the whole non-last fragments holding only entries below `before_entry_id`,
        moves the first retained entry to the first fragment kept, tells their bookies to
        `Trim`, and returns the new first retained entry id."""
        if type(before_entry_id) is not int or before_entry_id < 0:
            raise InvalidArgumentError(
                "before_entry_id must be an int >= 0", stream=name, entry_id=before_entry_id
            )
        return self._run(trim_stream(self._metadata, self._transport, name, before_entry_id))

    def seal_stream(self, name: str) -> None:
        """Runs a recovery (a takeover) and marks the stream SEALED: no writer ever again."""
        from stream.client.recovery import WriterIdentity  # a writer's modules: as open_writer
        from stream.client.seal import seal

        identity = WriterIdentity(f"sealer-{uuid.uuid4().hex[:8]}", socket.gethostname(), 0)
        self._run(
            seal(
                name,
                transport=self._transport,
                metadata=self._metadata,
                clock=self._clock,
                rng=self._child_rng(),
                options=self._writer_options,
                identity=identity,
            )
        )

    def survey_loss(self, name: str) -> LossSurvey:
        """Returns what `recover_accepting_loss` would give up now: which bookies of the last
        fragment are in limbo or unreachable, the last entry some bookie holds, and the range
        of entries that may be lost (docs/design.md §4). Changes nothing."""
        from stream.client.accept_loss import survey_loss  # a writer's modules: as open_writer

        validate_stream_name(name)
        return self._run(
            survey_loss(
                name,
                transport=self._transport,
                metadata=self._metadata,
                options=self._writer_options,
            )
        )

    def recover_accepting_loss(
        self, name: str, *, operator: str | None = None
    ) -> AcceptedLoss | None:
        """The way out when bookies in limbo keep every takeover from completing
        (`StreamInLimboError`): runs a recovery that ends the previous term after the last
        entry some reachable bookie holds, giving up whatever the limbo bookies may have lost,
        and records that (with `operator`, default user@host, and the time) in the stream's
        metadata. The stream is then OPEN with no writer; the bookies' repairs clear their
        limbo. Returns the record, None when no limbo stood in the way (nothing given up)."""
        from stream.client.accept_loss import recover_accepting_loss  # as open_writer
        from stream.client.recovery import WriterIdentity

        validate_stream_name(name)
        identity = WriterIdentity(f"recover-{uuid.uuid4().hex[:8]}", socket.gethostname(), 0)
        result = self._run(
            recover_accepting_loss(
                name,
                transport=self._transport,
                metadata=self._metadata,
                clock=self._clock,
                rng=self._child_rng(),
                options=self._writer_options,
                identity=identity,
                operator=operator or _operator(),
            )
        )
        return result.accepted_loss

    def delete_stream(self, name: str, *, force: bool = False) -> None:
        """Deletes the stream's metadata, then asks its bookies to drop its entries. A stream
        with a live writer raises `StreamInUseError` unless `force` (that writer then fails
        with `StreamNotFoundError`)."""

        self._run(delete_stream(self._metadata, self._transport, name, force=force))

    def close(self) -> None:
        """Closes the writers still open, the connections and the metadata session."""
        if self._closed:
            return
        for writer in list(self._writers):
            try:
                writer.close()
            except StreamError:
                pass
        self._closed = True
        try:
            self._loop.run(self._transport.close(), timeout_s=5)
        except Exception:  # closing anyway
            log.debug("client.transport_close_failed", exc_info=True)
        self._loop.stop()
        self._metadata.close()
        self._session.close()

    def __enter__(self) -> StreamClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _operator() -> str:
    """Returns who runs this process, as user@host (for the accept-loss record)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in the environment or the password database
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


class StreamWriter:
    """Appends to one stream (thread-safe). Use it as a context manager or `close()` it."""

    def __init__(self, client: StreamClient, core: AsyncStreamWriter) -> None:
        self._client = client
        self._core = core
        self._closed = False

    @property
    def stream(self) -> str:
        return self._core.name

    @property
    def term(self) -> int:
        """Returns the writer's term."""
        return self._core.term

    @property
    def last_add_confirmed(self) -> int:
        """Returns the highest id such that it and every lower id are acknowledged."""
        return self._core.last_add_confirmed

    @property
    def producer_id(self) -> str | None:
        """Returns the producer id the writer was opened with (None: not a producer)."""
        return self._core.producer_id

    @property
    def last_sequence(self) -> int:
        """Returns the producer's highest sequence: durably written before this writer took
        over, or appended since; -1 when the stream does not know the producer."""
        return self._core.last_sequence

    def append(
        self,
        payload: bytes,
        timeout_s: float | None = None,
        *,
        key: bytes | None = None,
        headers: HeadersArg | None = None,
        sequence: int | None = None,
    ) -> int:
        """Appends `payload`; blocks until it is acknowledged and returns its entry id. Not
        acknowledged within `timeout_s` (waiting for room in a full window not counted):
        `AppendTimeoutError`, and the entry may still be written.

        `key` (bytes) and `headers` ((name, value) pairs with str names and bytes values, in
        order, names may repeat; or a mapping of names to values) are stored with the entry,
        covered by its checksum; readers return them as `Entry.key` and `Entry.headers`.

        A producer writer's appends each need a `sequence`: one at or below `last_sequence`
        writes nothing and returns the id already written (-1 when no longer known); a gap or
        a step back raises `InvalidArgumentError` (docs/design.md §11). Other writers refuse
        `sequence`."""
        future = self.append_async(payload, key=key, headers=headers, sequence=sequence)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            raise AppendTimeoutError(
                "append not acknowledged in time; the entry may still be written",
                stream=self.stream,
                timeout_s=timeout_s,
            ) from None

    def append_async(
        self,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: HeadersArg | None = None,
        sequence: int | None = None,
    ) -> concurrent.futures.Future[int]:
        """Queues `payload` (with `key`, `headers` and `sequence`, see `append`) and returns a
        future of its entry id (resolved in id order); blocks only while the writer's window
        of unacknowledged entries is full. A producer's appends come from one thread at a
        time: their order is their sequences'."""
        return self._core.submit_threadsafe(payload, key, headers, sequence)

    def flush(self) -> None:
        """Returns once everything appended so far is acknowledged."""
        self._client._loop.run(self._core.flush())

    def abort(self) -> None:
        """Stops the writer at once, without flushing: pending appends (and one blocked on a
        full window) fail with `WriterClosedError`. What was not acknowledged may or may not be
        kept: the next writer's takeover decides. `close()` still releases the stream."""

        async def abort() -> None:
            self._core.abort()

        self._client._loop.run(abort())

    def close(self) -> None:
        """Flushes, publishes the final LAC and releases the stream (it stays open for the
        next writer, which takes over with a new term)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._client._loop.run(self._core.close())
        finally:
            self._client._writers.discard(self)

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except StreamError:
            pass  # the body's exception matters more


class StreamReader:
    """Reads one stream (one iteration at a time)."""

    def __init__(self, client: StreamClient, core: AsyncStreamReader) -> None:
        self._client = client
        self._core = core

    @property
    def stream(self) -> str:
        return self._core.name

    @property
    def stream_id(self) -> int:
        """The id of the stream this reader opened (a stream deleted and created again under
        its name has another)."""
        return self._core.meta.id

    def read(self, first: int, last: int) -> Iterator[Entry]:
        """Yields the entries `first..last` (no-ops left out); raises `EntryTrimmedError`
        below the first retained entry and `EntryNotWrittenError` above the LAC."""
        return self._iterate(lambda: self._core.read(first, last))

    def read_columns(self, first: int, last: int) -> Iterator[EntryColumns]:
        """As `read`, but yields the entries as `EntryColumns` (ids, payloads and timestamps,
        no `Entry` per entry), up to a ReadRange answer each: for bulk readers that build
        columns (Arrow)."""
        return self._iterate_lists(lambda: self._core.read_columns(first, last))

    def tail(
        self,
        start: str | int = "earliest",
        timeout_s: float | None = None,
        on_trimmed: str = "raise",
        *,
        cursor: Cursor | None = None,
        auto_commit_interval_s: float = 5.0,
        start_time_ms: int | None = None,
    ) -> Iterator[Entry]:
        """Yields entries as they are acknowledged, from `start` ("earliest", "latest" or an
        entry id), until none arrived for `timeout_s` seconds (None: forever) or, on a sealed
        stream, after its last entry. A tail that
        retention overtakes raises `EntryTrimmedError` (with the first retained entry id), or
        with `on_trimmed="skip"` continues from the first retained entry. `start_time_ms`
        (instead of `start`) starts at the first entry stamped at or after that time
        (milliseconds since the Unix epoch; see `seek_time`) and yields nothing earlier.

        With `cursor` (of this stream), the tail starts after the cursor's committed position
        (at `start` or `start_time_ms` when it was never committed) and commits, at most once
        every `auto_commit_interval_s` and when the iteration ends, the last entry the
        application came back for the next one after: at-least-once, a restart repeats at
        most what came after the last commit."""
        if cursor is None:
            return self._iterate(
                lambda: self._core.tail(start, timeout_s, on_trimmed, start_time_ms=start_time_ms)
            )
        if cursor.stream != self.stream:
            raise InvalidArgumentError(
                "the cursor belongs to another stream", stream=self.stream, cursor=cursor.name
            )
        interval_s = check_interval(auto_commit_interval_s)
        return self._tail_committing(
            cursor, start, timeout_s, on_trimmed, interval_s, start_time_ms
        )

    def _tail_committing(
        self,
        cursor: Cursor,
        start: str | int,
        timeout_s: float | None,
        on_trimmed: str,
        interval_s: float,
        start_time_ms: int | None,
    ) -> Iterator[Entry]:
        position = cursor.position
        committer = AutoCommitter(cursor.core, interval_s, position)
        begin = start if position is None else position + 1
        from_time = start_time_ms if position is None else None
        loop = self._client._loop
        task = loop.submit(committer.run())
        pending: int | None = None
        try:
            for entry in self._iterate(
                lambda: self._core.tail(begin, timeout_s, on_trimmed, start_time_ms=from_time)
            ):
                # Asked for the next entry: the application is done with the previous one.
                committer.done = pending
                if committer.error is not None:
                    raise committer.error
                pending = entry.entry_id
                yield entry
            committer.done = pending
        finally:
            task.cancel()
            if not loop.loop.is_closed():
                loop.run(committer.flush())

    def seek_time(self, ts_ms: int) -> int:
        """Returns the id of the first entry stamped at or after `ts_ms` (milliseconds since
        the Unix epoch): the first retained entry when all are that late, the id after the
        LAC (where the next entry goes) when all are earlier. Entry timestamps never go
        backwards within a stream, so every entry from there on is at least that late. Costs
        about log2(entries per fragment) single-entry reads (`last_seek_reads`)."""
        return self._client._loop.run(self._core.seek_time(ts_ms))

    @property
    def last_seek_reads(self) -> int:
        """Returns how many single-entry reads the last `seek_time` made."""
        return self._core.last_seek_reads

    def last_add_confirmed(self) -> int:
        """Returns the stream's LAC as its bookies report it now."""

        async def lac() -> int:
            await self._core.refresh()
            return await self._core.lac()

        return self._client._loop.run(lac())

    def _iterate(self, make: Callable[[], AsyncIterator[list[Entry]]]) -> Iterator[Entry]:
        lists = self._iterate_lists(make)
        try:
            for chunk in lists:
                yield from chunk
        finally:
            lists.close()  # stops the producer on the loop now, not when collected

    def _iterate_lists(
        self, make: Callable[[], AsyncIterator[Chunk]]
    ) -> Generator[Chunk, None, None]:
        loop = self._client._loop
        chunks: asyncio.Queue[Chunk | BaseException | None] | None = None
        producer: asyncio.Task[None] | None = None

        async def start() -> None:
            nonlocal chunks, producer
            chunks = asyncio.Queue(maxsize=_READ_PREFETCH_CHUNKS)
            producer = asyncio.ensure_future(produce(chunks))

        async def produce(queue: asyncio.Queue[Chunk | BaseException | None]) -> None:
            try:
                async for chunk in make():
                    await queue.put(chunk)
                await queue.put(None)
            except asyncio.CancelledError:
                raise
            except BaseException as e:
                await queue.put(e)

        async def take() -> Chunk | BaseException | None:
            assert chunks is not None
            return await chunks.get()

        async def stop() -> None:
            if producer is not None and not producer.done():
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)

        def generate() -> Generator[Chunk, None, None]:
            loop.run(start())
            try:
                while True:
                    item = loop.run(take())
                    if item is None:
                        return
                    if isinstance(item, BaseException):
                        raise item
                    yield item
            finally:
                if not loop.loop.is_closed():
                    loop.run(stop())

        return generate()


__all__ = ["Cursor", "RetentionPolicy", "StreamClient", "StreamReader", "StreamWriter"]
