"""The ReadRange and ReadLac requests of one data port connection (`stream.wire.frames`):
served one at a time, in order, by gRPC's own definitions (`BookieService.read_range_answers`,
`BookieService.read_lac_answer`), each answer written as one frame once the socket takes more,
then an END frame. Only the edge differs from gRPC: no HTTP/2 framing, no copy of each answer
into gRPC's buffers, no sending thread.

Each step reads one answer from the storage on the event loop (as gRPC's handler does) and
the next step is scheduled behind the loop's other work, so a long range does not hold up the
bookie's Adds; a reader that does not take its answers stops the range (`pause_writing`), as
the HTTP/2 window does."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Generator

from stream.bookie.server import BookieService, parse_read_lac, parse_read_range
from stream.wire import frames

_LENGTH = frames.LENGTH
_END_FRAME = frames.length_prefix(1) + frames.END
_READ_RANGE, _READ_LAC = frames.READ_RANGE[0], frames.READ_LAC[0]

# Whether the caller may make a request to an RPC: None, or why not (AccessControl.admit).
Admit = Callable[[str, object], str | None]


class RangeReads:
    """Serves the ReadRange requests of a data port connection once it is admitted; the
    connection hands it its buffer of received bytes (`take`) and its flow-control events."""

    def __init__(
        self,
        service: BookieService,
        transport: asyncio.Transport,
        buffer: bytearray,
        context: contextvars.Context,
        max_frame: int,
        refuse: Callable[[str], None],
        admit: Admit,
        kinded: bool,
    ) -> None:
        """`buffer` is the connection's received bytes (requests are taken from it as they are
        served); `context` holds the caller (CALLER); `refuse` answers a fault of the
        connection (a request frame over `max_frame` bytes) and closes it; `admit` says whether
        the caller may make each ReadLac (its ReadRange calls were admitted with the
        connection). `kinded`: the connection speaks version 2, each request starting with its
        kind; version 1 carries ReadRange requests alone."""
        self._service = service
        self._admit = admit
        self._kinded = kinded
        self._transport = transport
        self._context = context
        self._max_frame = max_frame
        self._refuse = refuse
        self._loop = asyncio.get_running_loop()
        self._answers: Generator[bytes, None, None] | None = None  # the range being served
        self._lac: asyncio.Task[bytes] | None = None  # the ReadLac being answered
        self._step_handle: asyncio.Handle | None = None
        self._buffer = buffer
        self._writable = True
        self._stopped = False
        self._draining = False  # the bookie stops: close once the range being served ends

    def take(self) -> None:
        """Starts serving the first complete request received unless one is being served;
        later requests wait in the buffer, and the connection stops reading while one is
        served."""
        buffer = self._buffer
        if self._answers is not None or self._lac is not None or self._stopped:
            return
        if len(buffer) < _LENGTH.size:
            self._transport.resume_reading()
            return
        (size,) = _LENGTH.unpack_from(buffer)
        if size > self._max_frame:
            self._refuse(f"a frame of {size} bytes is over this bookie's limit ({self._max_frame})")
            return
        end = _LENGTH.size + size
        if len(buffer) < end:
            self._transport.resume_reading()
            return
        body = bytes(buffer[_LENGTH.size : end])
        del buffer[:end]
        kind = _READ_RANGE
        if self._kinded:
            kind, body = (body[0], body[1:]) if body else (-1, body)
        self._transport.pause_reading()
        if kind == _READ_RANGE:
            self._answers = self._service.read_range_answers(parse_read_range(body))
            self._schedule()
        elif kind == _READ_LAC:
            request = parse_read_lac(body)
            refusal = self._admit("ReadLac", request)
            if refusal is not None:
                self._refuse(refusal)
                return
            self._lac = self._loop.create_task(
                self._service.read_lac_answer(request), context=self._context
            )
            self._lac.add_done_callback(self._lac_answered)
        else:
            self._refuse(f"a request of unknown kind {kind}")

    def _lac_answered(self, task: asyncio.Task[bytes]) -> None:
        """Writes a ReadLac's answer and END frame, and takes the next request."""
        if task is not self._lac:
            return  # the connection is gone (`stop`)
        self._lac = None
        if task.cancelled():
            return
        answer = task.result()  # read_lac_answer answers a fault with INTERNAL, not raising
        self._transport.write(
            frames.length_prefix(len(answer) + 1) + frames.ANSWER + answer + _END_FRAME
        )
        if self._draining:
            self._transport.close()
        else:
            self.take()

    def pause_writing(self) -> None:
        self._writable = False

    def resume_writing(self) -> None:
        self._writable = True
        self._schedule()

    def drain(self) -> None:
        """The bookie stops: the range being served ends, then the connection closes (at
        once when none is); the requests waiting are not served (the reader reads them
        elsewhere, or later, as after a failed gRPC call)."""
        self._draining = True
        if self._answers is None and self._lac is None:
            self._transport.close()

    def stop(self) -> None:
        """The connection is gone: the range being served stops (its count is taken)."""
        self._stopped = True
        if self._step_handle is not None:
            self._step_handle.cancel()
            self._step_handle = None
        answers, self._answers = self._answers, None
        if answers is not None:
            self._context.run(answers.close)
        lac, self._lac = self._lac, None
        if lac is not None:
            lac.cancel()

    def _schedule(self) -> None:
        if self._step_handle is None and self._answers is not None and not self._stopped:
            self._step_handle = self._loop.call_soon(self._step, context=self._context)

    def _step(self) -> None:
        """Writes the range's next answer, or its END frame and takes the next request."""
        self._step_handle = None
        answers = self._answers
        if answers is None or self._stopped or not self._writable:
            return  # resume_writing schedules the next step
        transport = self._transport
        answer = next(answers, None)
        if answer is None:
            self._answers = None
            transport.write(_END_FRAME)
            if self._draining:
                transport.close()
            else:
                self.take()
            return
        transport.write(frames.length_prefix(len(answer) + 1) + frames.ANSWER)
        # A memoryview: what the socket does not take at once is copied to the transport's
        # buffer once (a bytes slice would be copied first).
        transport.write(memoryview(answer))
        self._schedule()
