"""The ports through which the client's asyncio core (writer, reader, recovery) does ALL its I/O.

The core never imports grpc or kazoo and never reads a clock or sleeps except through the running
loop (`loop.time()`, `asyncio.sleep`, `asyncio.wait_for`): the simulator runs it on a virtual-time
loop with in-memory implementations of these Protocols; production uses
`stream.client.grpc_transport` and `stream.client.zk_metadata`.

Bookie answers are the wire messages of `stream.wire.bookie_pb2` (plain data, no I/O): an
implementation constructs them. A request that gets no answer (timeout, broken connection,
bookie down) RAISES: any exception is an unknown response and proves nothing.
"""

from __future__ import annotations

import asyncio
import operator
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from stream.framing.prepare import PreparedEntry
from stream.metadata.model import (
    AcceptedLoss,
    Fragment,
    ProducerChange,
    RetentionPolicy,
    StreamMeta,
    StreamState,
    WriterInfo,
)
from stream.protocol import BookieCandidate
from stream.wire import bookie_pb2 as pb
from stream.wire.frames import length_prefix

_framed = operator.attrgetter("framed")


@dataclass(slots=True)
class AddBatch:
    """One AddRequest for one bookie: the header fields and the prepared entries (empty: an
    explicit LAC). `to_bytes` gives the serialized AddRequest, `to_frame` the same framed for a
    data port, `to_request` the message. The bookies of a write set are sent the same batch
    object, and its frame is made once (one join of the entries for all of them)."""

    stream_id: int
    term: int
    lac: int
    lafr: int
    recovery: bool = False
    entries: Sequence[PreparedEntry] = field(default_factory=tuple)
    request_id: int = 0
    _frame: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def _header(self) -> bytes:
        return pb.AddRequest(
            stream_id=self.stream_id,
            term=self.term,
            lac=self.lac,
            lafr=self.lafr,
            recovery=self.recovery,
            request_id=self.request_id,
        ).SerializeToString()

    def to_bytes(self) -> bytes:
        """Returns the serialized AddRequest: the header serialized by protobuf, followed by the
        pre-framed entries (a repeated field may appear after the others on the wire)."""
        return b"".join([self._header(), *map(_framed, self.entries)])

    def to_frame(self) -> bytes:
        """Returns `to_bytes` framed for a data port (`stream.wire.frames`): made with one join
        on the first call, the same bytes on later ones."""
        frame = self._frame
        if frame is None:
            header = self._header()
            framed = list(map(_framed, self.entries))
            size = len(header) + sum(map(len, framed))
            frame = self._frame = b"".join([length_prefix(size), header, *framed])
        return frame

    def to_request(self) -> pb.AddRequest:
        """Returns the AddRequest message (decoded from `to_bytes`; for simulators and tests)."""
        return pb.AddRequest.FromString(self.to_bytes())


def answered_ids(response: pb.AddResponse) -> Sequence[int]:
    """Returns the ids an Add answer names: a range (`entry_count` ids from `first_entry_id`:
    a data port of version 2 names consecutive ids so, `stream.wire.frames`), else its
    `entry_ids`. Its `codes` hold one code per id, or one for all of them."""
    count = response.entry_count
    if count:
        return range(response.first_entry_id, response.first_entry_id + count)
    return response.entry_ids


def answered_codes(response: pb.AddResponse) -> list[int]:
    """Returns an Add answer's code for each id it names (`answered_ids`): one code for all of
    them is repeated; an answer naming no id (an explicit LAC, a batch that did not parse) keeps
    its one code."""
    codes: list[int] = list(response.codes)
    count = len(answered_ids(response))
    if len(codes) == 1 and count > 1:
        codes *= count
    return codes


def fail_waiting(futures: deque[asyncio.Future[pb.AddResponse]], error: BaseException) -> None:
    """Fails every future of an Add stream's unanswered batches with `error` (the stream
    broke: their fate is unknown)."""
    while futures:
        future = futures.popleft()
        if not future.done():
            future.set_exception(error)


class AddStream(Protocol):
    """One `Add` stream from one writer to one bookie. Batches are answered in the order they
    were sent. When the stream breaks, every unanswered batch's future fails (with any
    exception) and so does every later `send`."""

    def send(self, batch: AddBatch) -> asyncio.Future[pb.AddResponse]:
        """Queues `batch` and returns a future of its AddResponse (never blocks)."""
        ...

    def close(self) -> None:
        """Half-closes the stream once queued batches are sent; unanswered futures may fail."""
        ...


class BookieTransport(Protocol):
    """Requests to bookies by bookie id. Each call gives up after `timeout_s` by raising; any
    exception is an unknown response."""

    def open_add_stream(self, bookie_id: str, *, data_port: bool | None = None) -> AddStream:
        """Returns a new Add stream to `bookie_id` (connecting lazily; failures surface on the
        futures of `send`); `data_port` says whether it may go over the bookie's data port
        (None: the transport's default), where the transport has one."""
        ...

    async def fence(
        self, bookie_id: str, stream_id: int, term: int, *, timeout_s: float
    ) -> pb.FenceResponse: ...

    async def read(
        self, bookie_id: str, stream_id: int, entry_id: int, *, term: int = 0, timeout_s: float
    ) -> pb.ReadResponse:
        """A normal read (term 0) or a recovery read (term > 0)."""
        ...

    def read_range(
        self,
        bookie_id: str,
        stream_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        max_batch_bytes: int = 0,
        timeout_s: float,
        data_port: bool | None = None,
    ) -> AsyncIterator[pb.ReadRangeResponse]:
        """Yields the ReadRange responses; `timeout_s` bounds the whole range; `data_port` as
        for `open_add_stream`."""
        ...

    def read_range_raw(
        self,
        bookie_id: str,
        stream_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        max_batch_bytes: int = 0,
        timeout_s: float,
        data_port: bool | None = None,
    ) -> AsyncIterator[bytes | pb.ReadRangeResponse]:
        """As `read_range`, but each response may come serialized, as the bookie sent it (the
        reader walks its bytes: `stream.client.range_answer`), or as the message."""
        ...

    async def read_lac(
        self,
        bookie_id: str,
        stream_id: int,
        known_lac: int,
        *,
        wait_ms: int,
        timeout_s: float,
        data_port: bool | None = None,
    ) -> pb.ReadLacResponse:
        """Long poll: answers once the bookie's LAC is above `known_lac` or after `wait_ms`;
        `data_port` as for `read_range`."""
        ...

    async def truncate(
        self, bookie_id: str, stream_id: int, term: int, after_entry_id: int, *, timeout_s: float
    ) -> pb.TruncateResponse: ...

    async def trim(
        self, bookie_id: str, stream_id: int, before_entry_id: int, *, timeout_s: float
    ) -> pb.TrimResponse: ...

    async def stream_state(
        self, bookie_id: str, stream_id: int, *, timeout_s: float
    ) -> pb.StreamStateResponse: ...


class MetadataPort(Protocol):
    """The metadata operations the client needs, with the semantics (and errors) of
    `stream.metadata.StreamStore` and `BookieRegistry`: a CAS loser gets
    `stream.metadata.BadVersionError`; every error is a `StreamError`."""

    async def create_stream(
        self,
        name: str,
        ensemble: int,
        write_quorum: int,
        ack_quorum: int,
        fragment_max_entries: int,
        fragment_max_bytes: int,
        fragment_max_age_s: float | None = None,
        retention: RetentionPolicy | None = None,
    ) -> StreamMeta: ...

    async def get_stream(self, name: str) -> tuple[StreamMeta, int]:
        """Returns `(meta, version)`; raises `StreamNotFoundError`."""
        ...

    async def get_snapshot(self, stream_id: int) -> tuple[StreamMeta, int, list[Fragment]]:
        """Returns `(meta, version, fragments sorted)` as of one meta version."""
        ...

    async def begin_takeover(
        self, stream_id: int, expected_version: int
    ) -> tuple[StreamMeta, int, Fragment | None]: ...

    async def finish_recovery(
        self,
        stream_id: int,
        expected_version: int,
        term: int,
        fragments_changed: Sequence[Fragment],
        new_fragments: Sequence[Fragment],
        first_entry_id_of_term: int,
        producers: ProducerChange | None = None,
    ) -> tuple[StreamMeta, int]: ...

    async def record_accepted_loss(
        self, stream_id: int, expected_version: int, loss: AcceptedLoss
    ) -> tuple[StreamMeta, int]: ...

    async def add_fragment(
        self, stream_id: int, expected_version: int, new_fragment: Fragment, replaces_first_id: bool
    ) -> tuple[StreamMeta, int]: ...

    async def roll_fragment(
        self,
        stream_id: int,
        expected_version: int,
        closed_fragment: Fragment,
        new_fragment: Fragment,
        producers: ProducerChange | None = None,
    ) -> tuple[StreamMeta, int]: ...

    async def set_state(
        self, stream_id: int, expected_version: int, state: StreamState
    ) -> tuple[StreamMeta, int]: ...

    async def set_retention(
        self, stream_id: int, retention: RetentionPolicy | None
    ) -> tuple[StreamMeta, int]: ...

    async def trim_fragments(
        self,
        stream_id: int,
        expected_version: int,
        fragment_first_ids_to_delete: Sequence[int],
        new_first_entry_id: int,
    ) -> tuple[StreamMeta, int]: ...

    async def delete_stream(self, name: str) -> None: ...

    async def register_writer(self, stream_id: int, info: WriterInfo) -> None: ...

    async def get_writer(self, stream_id: int) -> WriterInfo | None:
        """Returns the stream's registered live writer, or None."""

    async def unregister_writer(self, stream_id: int) -> None: ...

    async def available_bookies(self) -> list[BookieCandidate]:
        """Returns the registered bookies (read-only ones with `writable=False`)."""
        ...

    def watch_meta(
        self, stream_id: int, callback: Callable[[int | None], None]
    ) -> Callable[[], None]:
        """Calls `callback(version)` ON THE LOOP THREAD soon after each change of the stream's
        meta (hence of its fragments), `callback(None)` when the stream is deleted; returns a
        function that stops the watch. Spurious calls are allowed."""
        ...


class WallClock(Protocol):
    """Wall-clock time for entry timestamps and fragment creation times (never for timeouts,
    which use the loop's monotonic time). `stream.clock.SystemClock` is the real one."""

    def now_ms(self) -> int:
        """Returns milliseconds since the Unix epoch."""
        ...
