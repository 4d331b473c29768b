"""The simulated network: message delivery between named nodes on the virtual-time loop, with
seeded latency, loss, duplication and reordering, links cut or clogged (FoundationDB's
swizzle-clog), and the client's `BookieTransport` on top of it.

Delivery model (what the real transport guarantees, and no more):
- A unary request and its answer are two independent messages: each may be lost (the caller
  times out), delayed by a latency spike (so later messages overtake it) or, for requests that
  are safe to repeat (fence, reads, ReadLac, StreamState), duplicated: the copy is served again
  later and its answer dropped, as a retrying proxy would.
- An `Add` stream is ordered both ways (gRPC streams run over one HTTP/2 stream): batches are
  never reordered or duplicated within it, but a lost message breaks the whole stream (every
  unanswered batch fails), as a reset connection does. Different streams and unary calls are
  independent of each other, so an old stream's batch may land after a newer request.
- A cut link drops what crosses it; a clogged link holds messages until it is unclogged (or
  the clog's end), then delivers them in order. Clogging every link of a node pauses it: a
  writer whose links are clogged is a "zombie" that wakes up later with its messages.
- A bookie that is down refuses connections: requests fail fast; its Add streams break.
- ZooKeeper calls cross the network too (latency and clogs, never lost: kazoo retries).

Every random draw comes from the `random.Random` passed in.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from stream.client.ports import AddBatch
from stream.sim.fault_history import LINK_FAULTS, PAUSE, FaultHistory
from stream.sim.trace import Trace
from stream.wire import bookie_pb2 as pb

if TYPE_CHECKING:
    from stream.sim.bookie import SimBookie

T = TypeVar("T")

# Virtual wall clock at the start of every simulation (entry timestamps, created_ms).
EPOCH_MS = 1_700_000_000_000
ZK_NODE = "zk"
# Spacing of deliveries released together (after a clog), so that they keep their order.
_TICK_S = 1e-6


@dataclass(frozen=True, slots=True)
class NetworkFaults:
    """The random part of the network. Times in seconds."""

    latency_min_s: float = 0.0005
    latency_max_s: float = 0.003
    # A message is delayed by up to `spike_max_s` more with this probability (reordering).
    spike_rate: float = 0.0
    spike_max_s: float = 0.05
    loss_rate: float = 0.0
    duplicate_rate: float = 0.0


class NetworkError(ConnectionError):
    """A simulated transport failure (refused, reset, broken stream)."""


class SimNetwork:
    """Delivers messages between nodes; bookies are looked up by id in `bookies`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        rng: random.Random,
        trace: Trace,
        faults: NetworkFaults = NetworkFaults(),
    ) -> None:
        self.loop = loop
        self.rng = rng
        self.trace = trace
        self.faults = faults
        self.bookies: dict[str, SimBookie] = {}
        # Per directed link (src, dst): cut until / clogged until (inf: until restored).
        self._cut: dict[tuple[str, str], float] = {}
        self._clog: dict[tuple[str, str], float] = {}
        self._node_clog: dict[str, float] = {}
        self._extra_latency: dict[tuple[str, str], float] = {}
        # Links whose Add stream batches (or unary messages) are held: directed scripts.
        self._held_adds: set[tuple[str, str]] = set()
        self._held_unary: set[tuple[str, str]] = set()
        # Deliveries held by an indefinite clog: each resumes (and re-checks) once released.
        self._parked: list[Callable[[], None]] = []
        # Insertion-ordered (a dict, not a set): breaking streams in a fixed order.
        self._streams: dict[str, dict[SimAddStream, None]] = {}
        self.messages = 0
        self.lost = 0
        # Every link and node fault, as spans of virtual time (the checker's needless-give-up
        # property asks it; the bookies' and clients' faults are added by `Simulation`).
        self.history = FaultHistory(loop.time)

    # ------------------------------------------------------------------ time

    def now(self) -> float:
        return self.loop.time()

    def now_ms(self) -> int:
        """Returns the virtual wall clock in milliseconds since the Unix epoch."""
        return EPOCH_MS + int(self.loop.time() * 1000)

    # ------------------------------------------------------------------ link state

    def cut(self, a: str, b: str, duration_s: float = math.inf, *, both: bool = True) -> None:
        """Drops every message from `a` to `b` (and back with `both`) for `duration_s`."""
        until = self.now() + duration_s
        for link in ((a, b), (b, a)) if both else ((a, b),):
            self._cut[link] = until
            self.history.start("cut", *link, duration_s=duration_s)
            self._break_streams_on(link)
        self.trace.record("cut", a=a, b=b, both=int(both), d=round(duration_s, 4))

    def restore(self, a: str, b: str) -> None:
        """Ends any cut, clog and extra latency on the links between `a` and `b`."""
        for link in ((a, b), (b, a)):
            self._cut.pop(link, None)
            self._clog.pop(link, None)
            self._extra_latency.pop(link, None)
            for kind in ("cut", "clog", "slow"):
                self.history.end(kind, *link)
        self.trace.record("restore", a=a, b=b)
        self._release_parked()

    def clog(self, a: str, b: str, duration_s: float = math.inf, *, both: bool = True) -> None:
        """Holds every message from `a` to `b` (and back with `both`) for `duration_s`."""
        until = self.now() + duration_s
        for link in ((a, b), (b, a)) if both else ((a, b),):
            self._clog[link] = max(self._clog.get(link, 0.0), until)
            self.history.start("clog", *link, duration_s=duration_s)
        self.trace.record("clog", a=a, b=b, both=int(both), d=round(duration_s, 4))
        if duration_s != math.inf:
            self.loop.call_at(until + _TICK_S, self._release_parked)

    def clog_node(self, node: str, duration_s: float = math.inf) -> None:
        """Holds every message to and from `node` for `duration_s` (a paused process)."""
        until = self.now() + duration_s
        self._node_clog[node] = max(self._node_clog.get(node, 0.0), until)
        self.history.start(PAUSE, node, duration_s=duration_s)
        self.trace.record("pause", n=node, d=round(duration_s, 4))
        if duration_s != math.inf:
            self.loop.call_at(until + _TICK_S, self._release_parked)

    def unclog_node(self, node: str) -> None:
        """Ends `node`'s pause: its held messages are delivered."""
        self._node_clog.pop(node, None)
        self.history.end(PAUSE, node)
        self.trace.record("resume", n=node)
        self._release_parked()

    def slow(self, a: str, b: str, extra_s: float, duration_s: float = math.inf) -> None:
        """Adds `extra_s` of latency to the links between `a` and `b` for `duration_s`."""
        self._extra_latency[(a, b)] = extra_s
        self._extra_latency[(b, a)] = extra_s
        for link in ((a, b), (b, a)):
            # Its end is `_unslow`'s, or an earlier restore (a later slow outlives the span).
            self.history.start("slow", *link, duration_s=duration_s)
        self.trace.record("slow", a=a, b=b, d=extra_s)
        if duration_s != math.inf:
            self.loop.call_later(duration_s, self._unslow, a, b, extra_s)

    def _unslow(self, a: str, b: str, extra_s: float) -> None:
        for link in ((a, b), (b, a)):
            if self._extra_latency.get(link) == extra_s:
                del self._extra_latency[link]

    def paused(self, node: str) -> bool:
        """Returns whether `node` is paused now (`clog_node`)."""
        return self._node_clog.get(node, 0.0) > self.now()

    def hold_adds(self, src: str, dst: str, duration_s: float = math.inf) -> None:
        """Holds the Add stream batches from `src` to `dst` (unary requests still pass) until
        `release_adds`, `heal` or `duration_s` passed."""
        self._held_adds.add((src, dst))
        self.history.start("hold_adds", src, dst)
        self.trace.record("hold_adds", a=src, b=dst)
        if duration_s != math.inf:
            self.loop.call_later(duration_s, self.release_adds, src, dst)

    def release_adds(self, src: str, dst: str) -> None:
        """Delivers the held Add stream batches from `src` to `dst`."""
        self._held_adds.discard((src, dst))
        self.history.end("hold_adds", src, dst)
        self.trace.record("release_adds", a=src, b=dst)
        self._release_parked()

    def hold_unary(self, src: str, dst: str) -> None:
        """Holds the unary messages from `src` to `dst` (Add streams still flow) until
        `release_unary` or `heal` (directed scripts)."""
        self._held_unary.add((src, dst))
        self.history.start("hold_unary", src, dst)
        self.trace.record("hold_unary", a=src, b=dst)

    def release_unary(self, src: str, dst: str) -> None:
        """Delivers the held unary messages from `src` to `dst`."""
        self._held_unary.discard((src, dst))
        self.history.end("hold_unary", src, dst)
        self.trace.record("release_unary", a=src, b=dst)
        self._release_parked()

    def heal(self) -> None:
        """Ends every cut, clog, pause and extra latency (the end of a run)."""
        self._cut.clear()
        self._clog.clear()
        self._node_clog.clear()
        self._extra_latency.clear()
        self._held_adds.clear()
        self._held_unary.clear()
        self.history.end_all((*LINK_FAULTS, PAUSE))
        self.trace.record("heal")
        self._release_parked()

    def is_cut(self, src: str, dst: str) -> bool:
        return self._cut.get((src, dst), 0.0) > self.now()

    def flows(self, src: str, dst: str) -> bool:
        """Returns whether messages from `src` to `dst` go through now: no cut, clog, pause
        or hold on that link."""
        link = (src, dst)
        return (
            not self.is_cut(src, dst)
            and self.clogged_until(src, dst) <= self.now()
            and link not in self._held_adds
            and link not in self._held_unary
        )

    def clogged_until(self, src: str, dst: str) -> float:
        """Returns until when messages from `src` to `dst` are held (<= now: not held)."""
        return max(
            self._clog.get((src, dst), 0.0),
            self._node_clog.get(src, 0.0),
            self._node_clog.get(dst, 0.0),
        )

    def _release_parked(self) -> None:
        parked, self._parked = self._parked, []
        for resume in parked:
            resume()

    # ------------------------------------------------------------------ delivery

    def latency(self, src: str, dst: str) -> float:
        """Returns one message's delay from `src` to `dst` (drawn)."""
        faults = self.faults
        delay = self.rng.uniform(faults.latency_min_s, faults.latency_max_s)
        if faults.spike_rate and self.rng.random() < faults.spike_rate:
            delay += self.rng.uniform(0.0, faults.spike_max_s)
        return delay + self._extra_latency.get((src, dst), 0.0)

    def transmit(
        self, src: str, dst: str, deliver: Callable[[], None], *, lossy: bool = True
    ) -> bool:
        """Sends one independent message; returns False when it is dropped at once (cut link
        or loss). `deliver` runs at `dst` unless the link is cut by then."""
        self.messages += 1
        if self.is_cut(src, dst) or (
            lossy and self.faults.loss_rate and self.rng.random() < self.faults.loss_rate
        ):
            self.lost += 1
            return False
        self.loop.call_later(self.latency(src, dst), self._deliver, src, dst, deliver)
        return True

    def _deliver(self, src: str, dst: str, deliver: Callable[[], None]) -> None:
        if self.is_cut(src, dst):
            self.lost += 1
            return
        until = self.clogged_until(src, dst)
        if (src, dst) in self._held_unary:
            until = math.inf
        now = self.now()
        if until > now:
            if until == math.inf:
                self._parked.append(lambda: self._deliver(src, dst, deliver))
            else:
                self.loop.call_at(until + _TICK_S, self._deliver, src, dst, deliver)
            return
        deliver()

    def notify(self, src: str, dst: str, fn: Callable[[], None]) -> None:
        """Delivers a notification (a watch event) from `src` to `dst`, never lost."""
        self.transmit(src, dst, fn, lossy=False)

    # ------------------------------------------------------------------ unary calls

    async def rpc(
        self,
        src: str,
        bookie_id: str,
        serve: Callable[[SimBookie], Any],
        *,
        timeout_s: float,
        repeatable: bool = False,
    ) -> Any:
        """Returns `serve(bookie)`'s answer as seen from `src` (an awaitable answer is awaited
        at the bookie); raises `NetworkError` when refused, `TimeoutError` after `timeout_s`."""
        loop = self.loop
        answer: asyncio.Future[Any] = loop.create_future()

        def reply(value: Any = None, error: BaseException | None = None) -> None:
            def arrive() -> None:
                if answer.done():
                    return
                if error is not None:
                    answer.set_exception(error)
                else:
                    answer.set_result(value)

            self.transmit(bookie_id, src, arrive)

        def at_bookie(first: bool) -> None:
            bookie = self.bookies[bookie_id]
            if not bookie.up:
                if first:
                    reply(error=NetworkError(f"{bookie_id} refused the connection"))
                return
            incarnation = bookie.incarnation
            result = serve(bookie)
            if not first:
                return  # a duplicate: served again, its answer is dropped
            if isinstance(result, asyncio.Future):

                def done(f: asyncio.Future[Any]) -> None:
                    if f.cancelled() or f.exception() is not None:
                        reply(error=NetworkError(f"{bookie_id} reset the connection"))
                    elif bookie.incarnation != incarnation:
                        reply(error=NetworkError(f"{bookie_id} restarted"))
                    else:
                        reply(f.result())

                result.add_done_callback(done)
            else:
                reply(result)

        self.transmit(src, bookie_id, lambda: at_bookie(True))
        if (
            repeatable
            and self.faults.duplicate_rate
            and self.rng.random() < self.faults.duplicate_rate
        ):
            self.transmit(src, bookie_id, lambda: at_bookie(False))
        return await asyncio.wait_for(answer, timeout_s)

    async def call_zk(self, src: str, fn: Callable[[], T]) -> T:
        """Returns `fn()` run at the ZooKeeper node (its error raised here), one hop each way."""
        answer: asyncio.Future[T] = self.loop.create_future()

        def at_zk() -> None:
            try:
                value = fn()
            except Exception as e:
                error: BaseException | None = e
                value = None
            else:
                error = None

            def arrive() -> None:
                if answer.done():
                    return
                if error is not None:
                    answer.set_exception(error)
                else:
                    answer.set_result(value)  # type: ignore[arg-type]

            self.transmit(ZK_NODE, src, arrive, lossy=False)

        self.transmit(src, ZK_NODE, at_zk, lossy=False)
        return await answer

    # ------------------------------------------------------------------ add streams

    def _break_streams_on(self, link: tuple[str, str]) -> None:
        src, dst = link
        for bookie_id in (src, dst):
            for stream in list(self._streams.get(bookie_id, ())):
                if {stream.src, stream.bookie_id} == {src, dst}:
                    stream.fail("link cut")

    def break_streams(self, bookie_id: str, reason: str) -> None:
        """Breaks every connected Add stream to `bookie_id` (it crashed). A stream that never
        sent anything has no connection yet (the transport connects lazily): it connects to
        whichever incarnation of the bookie is up when it first sends."""
        for stream in list(self._streams.get(bookie_id, ())):
            if stream.connected:
                stream.fail(reason)

    def _register(self, stream: SimAddStream) -> None:
        self._streams.setdefault(stream.bookie_id, {})[stream] = None

    def _unregister(self, stream: SimAddStream) -> None:
        streams = self._streams.get(stream.bookie_id)
        if streams is not None:
            streams.pop(stream, None)


class _Channel:
    """One direction of an ordered stream: messages delivered in the order sent, each after
    its latency and never before the previous one; a lost message calls `on_lost`."""

    def __init__(self, network: SimNetwork, src: str, dst: str, on_lost: Callable[[], None]):
        self._net = network
        self.src = src
        self.dst = dst
        self._on_lost = on_lost
        self._queue: deque[tuple[float, Callable[[], None]]] = deque()
        self._last_ready = 0.0
        self._armed = False
        self.closed = False

    def push(self, deliver: Callable[[], None]) -> None:
        net = self._net
        net.messages += 1
        if net.is_cut(self.src, self.dst) or (
            net.faults.loss_rate and net.rng.random() < net.faults.loss_rate
        ):
            net.lost += 1
            self._on_lost()
            return
        ready = max(net.now() + net.latency(self.src, self.dst), self._last_ready + _TICK_S)
        self._last_ready = ready
        self._queue.append((ready, deliver))
        if not self._armed:
            self._arm(ready)

    def _arm(self, at: float) -> None:
        self._armed = True
        self._net.loop.call_at(at, self._pump)

    def _pump(self) -> None:
        self._armed = False
        net = self._net
        while self._queue and not self.closed:
            ready, deliver = self._queue[0]
            now = net.now()
            if ready > now:
                self._arm(ready)
                return
            if net.is_cut(self.src, self.dst):
                self._on_lost()
                return
            until = net.clogged_until(self.src, self.dst)
            if (self.src, self.dst) in net._held_adds:
                until = math.inf
            if until > now:
                if until == math.inf:
                    self._armed = True
                    net._parked.append(self._pump)
                else:
                    self._arm(until + _TICK_S)
                return
            self._queue.popleft()
            deliver()

    def clear(self) -> None:
        self.closed = True
        self._queue.clear()


class SimAddStream:
    """One `Add` stream from a client node to a bookie (see `stream.client.ports.AddStream`):
    batches answered in order; when it breaks, every unanswered batch fails, and so does every
    later send."""

    def __init__(self, network: SimNetwork, src: str, bookie_id: str) -> None:
        self._net = network
        self.src = src
        self.bookie_id = bookie_id
        self._pending: deque[asyncio.Future[pb.AddResponse]] = deque()
        self._broken: str | None = None
        self._closed = False
        self._incarnation: int | None = None
        # Answers the bookie gives later (once durable), sent back in request order.
        self._answering: deque[asyncio.Future[pb.AddResponse]] = deque()
        self._up = _Channel(network, src, bookie_id, lambda: self.fail("request lost"))
        self._down = _Channel(network, bookie_id, src, lambda: self.fail("answer lost"))
        network._register(self)

    def send(self, batch: AddBatch) -> asyncio.Future[pb.AddResponse]:
        """Queues `batch` and returns the future of its answer."""
        future: asyncio.Future[pb.AddResponse] = self._net.loop.create_future()
        # A failed batch's error may never be looked at (the writer dropped the link first).
        future.add_done_callback(_consume_error)
        if self._broken is not None or self._closed:
            future.set_exception(NetworkError(self._broken or "stream closed"))
            return future
        self._pending.append(future)
        if self._incarnation is None:
            # The first send connects, to the bookie's incarnation of the moment.
            self._incarnation = self._net.bookies[self.bookie_id].incarnation
        # The bytes go too: the bookie scans them as the gRPC service does (`parse_add`).
        raw = batch.to_bytes()
        request = pb.AddRequest.FromString(raw)
        self._up.push(lambda: self._at_bookie(request, raw))
        return future

    @property
    def connected(self) -> bool:
        """Returns whether this stream ever sent (so holds a connection that a crash breaks)."""
        return self._incarnation is not None

    def _at_bookie(self, request: pb.AddRequest, raw: bytes) -> None:
        bookie = self._net.bookies[self.bookie_id]
        if not bookie.up:
            self.fail("bookie down")
            return
        if self._incarnation != bookie.incarnation:
            self.fail("bookie restarted")
            return
        response = bookie.add(request, raw)
        if isinstance(response, asyncio.Future) or self._answering:
            # The bookie answers once the batch is durable: in order, after earlier ones.
            if not isinstance(response, asyncio.Future):
                done: asyncio.Future[pb.AddResponse] = self._net.loop.create_future()
                done.set_result(response)
                response = done
            self._answering.append(response)
            response.add_done_callback(lambda _: self._send_answers())
            return
        self._down.push(lambda: self._at_client(response))

    def _send_answers(self) -> None:
        while self._answering and self._answering[0].done():
            answer = self._answering.popleft()
            if self._broken is not None:
                continue
            if answer.cancelled() or answer.exception() is not None:
                self.fail("bookie reset the stream")
                return
            response = answer.result()
            self._down.push(lambda r=response: self._at_client(r))  # type: ignore[misc]

    def _at_client(self, response: pb.AddResponse) -> None:
        if self._pending:
            future = self._pending.popleft()
            if not future.done():
                future.set_result(response)

    def fail(self, reason: str) -> None:
        """Breaks the stream: unanswered batches fail with `NetworkError(reason)`."""
        if self._broken is not None:
            return
        self._broken = reason
        self._up.clear()
        self._down.clear()
        self._net._unregister(self)
        error = NetworkError(f"add stream to {self.bookie_id} broke: {reason}")
        while self._pending:
            future = self._pending.popleft()
            if not future.done():
                future.set_exception(error)

    def close(self) -> None:
        """Half-closes: later sends fail; answers to queued batches may still arrive."""
        self._closed = True


def _consume_error(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class SimTransport:
    """The client's `BookieTransport` for one client node of the simulated network."""

    def __init__(self, network: SimNetwork, node: str) -> None:
        self._net = network
        self.node = node

    def open_add_stream(self, bookie_id: str, *, data_port: bool | None = None) -> SimAddStream:
        # The simulated network has one kind of connection: `data_port` changes nothing here.
        return SimAddStream(self._net, self.node, bookie_id)

    def _rpc(
        self,
        bookie_id: str,
        serve: Callable[[SimBookie], Awaitable[T]],
        timeout_s: float,
        repeat: bool,
    ) -> Awaitable[T]:
        """`serve(bookie)`'s answer as seen from this node (`SimNetwork.rpc`)."""
        return self._net.rpc(self.node, bookie_id, serve, timeout_s=timeout_s, repeatable=repeat)

    async def fence(
        self, bookie_id: str, stream_id: int, term: int, *, timeout_s: float
    ) -> pb.FenceResponse:
        request = pb.FenceRequest(stream_id=stream_id, term=term)
        return await self._rpc(bookie_id, lambda b: b.fence(request), timeout_s, True)

    async def read(
        self, bookie_id: str, stream_id: int, entry_id: int, *, term: int = 0, timeout_s: float
    ) -> pb.ReadResponse:
        request = pb.ReadRequest(stream_id=stream_id, entry_id=entry_id, term=term)
        return await self._rpc(bookie_id, lambda b: b.read(request), timeout_s, True)

    async def read_range(
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
        request = pb.ReadRangeRequest(
            stream_id=stream_id,
            first_entry_id=first_entry_id,
            last_entry_id=last_entry_id,
            max_batch_bytes=max_batch_bytes,
        )
        responses: list[pb.ReadRangeResponse] = await self._net.rpc(
            self.node,
            bookie_id,
            lambda b: b.read_range(request),
            timeout_s=timeout_s,
            repeatable=True,
        )
        for response in responses:
            yield response

    async def read_range_raw(
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
        """`read_range` with each response serialized, as the gRPC transport hands them over:
        simulated readers walk the bytes as real ones do."""
        responses = self.read_range(
            bookie_id,
            stream_id,
            first_entry_id,
            last_entry_id,
            max_batch_bytes=max_batch_bytes,
            timeout_s=timeout_s,
        )
        async for response in responses:
            yield response.SerializeToString()

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
        request = pb.ReadLacRequest(stream_id=stream_id, known_lac=known_lac, timeout_ms=wait_ms)
        return await self._rpc(bookie_id, lambda b: b.read_lac(request), timeout_s, True)

    async def truncate(
        self, bookie_id: str, stream_id: int, term: int, after_entry_id: int, *, timeout_s: float
    ) -> pb.TruncateResponse:
        request = pb.TruncateRequest(stream_id=stream_id, term=term, after_entry_id=after_entry_id)
        return await self._rpc(bookie_id, lambda b: b.truncate(request), timeout_s, False)

    async def trim(
        self, bookie_id: str, stream_id: int, before_entry_id: int, *, timeout_s: float
    ) -> pb.TrimResponse:
        request = pb.TrimRequest(stream_id=stream_id, before_entry_id=before_entry_id)
        return await self._rpc(bookie_id, lambda b: b.trim(request), timeout_s, False)

    async def stream_state(
        self, bookie_id: str, stream_id: int, *, timeout_s: float
    ) -> pb.StreamStateResponse:
        request = pb.StreamStateRequest(stream_id=stream_id)
        return await self._rpc(bookie_id, lambda b: b.stream_state(request), timeout_s, True)


class SimClock:
    """The client's `WallClock` port on virtual time."""

    def __init__(self, network: SimNetwork) -> None:
        self._net = network

    def now_ms(self) -> int:
        return self._net.now_ms()


class SkewedClock:
    """A client's wall clock, off from `clock` by `offset_ms` (ahead or behind)."""

    def __init__(self, clock: SimClock, offset_ms: int) -> None:
        self._clock = clock
        self.offset_ms = offset_ms

    def now_ms(self) -> int:
        return max(self._clock.now_ms() + self.offset_ms, 0)
