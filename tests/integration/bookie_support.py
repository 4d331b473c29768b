"""Helpers of the bookie integration tests: entries with checksums, a pipelined Add stream over
the synchronous gRPC client, and a factory of bookie processes that stops them all."""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from stream.protocol.checksum import entry_checksum
from stream.sandbox.bookies import BookieProcess
from stream.sandbox.cluster import SandboxCluster
from stream.wire import bookie_pb2 as pb
from stream.wire import bookie_pb2_grpc

TIMESTAMP_MS = 1_700_000_000_000


def payload_of(stream_id: int, entry_id: int, size: int = 64) -> bytes:
    """Returns a deterministic payload for an entry (so a reader can check the bytes)."""
    head = f"{stream_id}:{entry_id}:".encode()
    return (head * (size // len(head) + 1))[:size]


def make_entry(
    stream_id: int, entry_id: int, payload: bytes | None = None, flags: int = 0
) -> pb.Entry:
    """Returns an entry with a correct checksum."""
    if payload is None:
        payload = payload_of(stream_id, entry_id)
    return pb.Entry(
        entry_id=entry_id,
        flags=flags,
        timestamp_ms=TIMESTAMP_MS,
        payload=payload,
        crc32c=entry_checksum(stream_id, entry_id, flags, TIMESTAMP_MS, payload),
    )


def add_request(
    stream_id: int,
    term: int,
    entry_ids: range | list[int],
    *,
    lac: int = -1,
    lafr: int = -1,
    request_id: int = 0,
    recovery: bool = False,
    size: int = 64,
) -> pb.AddRequest:
    """Returns one add batch of entries with deterministic payloads."""
    return pb.AddRequest(
        stream_id=stream_id,
        term=term,
        lac=lac,
        lafr=lafr,
        recovery=recovery,
        request_id=request_id,
        entries=[make_entry(stream_id, i, payload_of(stream_id, i, size)) for i in entry_ids],
    )


def add_all(
    stub: bookie_pb2_grpc.BookieStub, requests: list[pb.AddRequest]
) -> list[pb.AddResponse]:
    """Sends `requests` on one Add stream and returns every response."""
    return list(stub.Add(iter(requests), timeout=30))


class AddPipeline:
    """One Add stream with up to `window` batches in flight, over the synchronous client:
    `send` blocks while the window is full; responses are collected by a thread."""

    def __init__(self, stub: bookie_pb2_grpc.BookieStub, window: int = 16) -> None:
        self._requests: queue.Queue[pb.AddRequest | None] = queue.Queue()
        self._window = threading.Semaphore(window)
        self.responses: list[pb.AddResponse] = []
        self.error: grpc.RpcError | None = None
        self.done = threading.Event()
        self._call = stub.Add(self._request_iterator())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _request_iterator(self) -> Iterator[pb.AddRequest]:
        while (request := self._requests.get()) is not None:
            yield request

    def _read(self) -> None:
        try:
            for response in self._call:
                self.responses.append(response)
                self._window.release()
        except grpc.RpcError as e:
            self.error = e
        finally:
            self.done.set()
            self._requests.put(None)  # unblock gRPC's request thread

    def send(self, request: pb.AddRequest, timeout_s: float = 10.0) -> bool:
        """Queues `request` once the window allows; returns False when the stream ended."""
        deadline = time.monotonic() + timeout_s
        while not self._window.acquire(timeout=0.05):
            if self.done.is_set():
                return False
            if time.monotonic() > deadline:
                raise TimeoutError("add window stayed full")
        if self.done.is_set():
            return False
        self._requests.put(request)
        return True

    def acked(self) -> list[int]:
        """Returns the entry ids acknowledged OK so far."""
        ids = []
        for response in list(self.responses):
            ids.extend(
                i for i, c in zip(response.entry_ids, response.codes, strict=True) if c == pb.OK
            )
        return ids

    def close(self, timeout_s: float = 30.0) -> None:
        """Half-closes the stream and waits for the remaining responses."""
        self._requests.put(None)
        if not self.done.wait(timeout_s):
            self._call.cancel()
            raise TimeoutError("Add stream did not finish")

    def cancel(self) -> None:
        self._call.cancel()
        self._requests.put(None)
        self.done.wait(10)


def wait_until(predicate: Callable[[], Any], timeout_s: float = 20.0, what: str = "") -> Any:
    """Returns the first truthy value of `predicate()`, polled until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)


# For tests of a bookie alone, whose streams exist in no metadata: the bookies do not check
# terms and trims against metadata (test-only switches; the checks have their own tests in
# test_bookie_refusals.py and tests/unit/bookie/test_metadata_checks.py).
METADATA_UNCHECKED = ("metadata_term_check", "trim_check")


def sigterm_all(bookies: Iterable[BookieProcess]) -> None:
    """Sends SIGTERM to every running bookie at once. A stop one after the other
    (SandboxCluster.stop, BookieProcess.close) waits out each clean shutdown in turn; signalled
    together they shut down side by side, and those waits find them gone (a second SIGTERM
    changes nothing). About 1-3 s less per three-bookie cluster on the 2-core machine."""
    for bookie in bookies:
        if bookie.process is not None and bookie.process.poll() is None:
            bookie.process.send_signal(signal.SIGTERM)


def stop_cluster(cluster: SandboxCluster) -> None:
    """Stops `cluster` (see sigterm_all)."""
    sigterm_all(cluster.bookies)
    cluster.stop()


class BookieFactory:
    """Starts bookie processes in a test's temporary directory against one metadata root, and
    stops every one of them at the end. Each starts with the test-only switches
    `unsafe_skips` holds when it is created (`stream.bookie.unsafe`)."""

    def __init__(self, base: Path, metadata: str, *, unsafe_skips: Sequence[str] = ()) -> None:
        self.base = base
        self.metadata = metadata
        self.unsafe_skips = tuple(unsafe_skips)
        self.bookies: list[BookieProcess] = []

    def create(self, bookie_id: str = "bookie-1", **settings: Any) -> BookieProcess:
        """Returns a configured bookie process, not started."""
        settings.setdefault("flush_interval_ms", 200)
        bookie = BookieProcess(
            bookie_id,
            self.base / bookie_id,
            self.metadata,
            metrics_port=0,
            settings=settings,
            unsafe_skips=self.unsafe_skips,
        )
        self.bookies.append(bookie)
        return bookie

    def start(self, bookie_id: str = "bookie-1", **settings: Any) -> BookieProcess:
        """Returns a started bookie that answers Info."""
        bookie = self.create(bookie_id, **settings).start()
        bookie.wait_ready()
        return bookie

    def stop_all(self) -> None:
        sigterm_all(self.bookies)
        for bookie in self.bookies:
            try:
                bookie.close()
            except Exception:  # keep stopping the others; the test already failed or passed
                bookie.kill9()


def metric_value(bookie: BookieProcess, name: str, **labels: str) -> float:
    """Returns the sum of the samples of `name` on `bookie`'s Prometheus endpoint whose labels
    include `labels` (0 when none)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{bookie.metrics_address}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )
