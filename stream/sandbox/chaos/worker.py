"""A workload process of the chaos harness (run on a host of its own): a writer that appends
and takes the stream over again when superseded, or a reader that tails it. Every append's
invocation and outcome and every entry read go to the history file.

    python -m stream.sandbox.chaos.worker writer|reader --metadata M --stream S --name N
        --history FILE [--reengage] [--seed N] [--without-protection NAME]
        [--session-timeout SECONDS]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import itertools
import random
import signal
import threading
from pathlib import Path

from stream.client import StreamClient, StreamReader, StreamWriter
from stream.client.options import Protections, ReaderOptions, WriterOptions
from stream.errors import (
    EntryTrimmedError,
    MetadataUnavailableError,
    StreamError,
    StreamSealedError,
)
from stream.logs import configure_logging
from stream.metadata.connection import MetadataSession
from stream.sandbox.chaos.history import ACK, ERROR, FAIL, INVOKE, OPEN, READ, HistoryWriter

# A superseded writer waits this long (at random) before it takes the stream over again.
_RETAKE_S = (1.0, 4.0)
# How long the writer waits for one of its appends in flight before looking at `stop` again.
_APPEND_TIMEOUT_S = 5.0
# A reader reads back up to `_REREAD_MAX` + 1 entries from the last `_REREAD_SPAN` it tailed,
# every `_REREAD_EVERY_S`.
_REREAD_EVERY_S = 1.0
_REREAD_SPAN = 2000
_REREAD_MAX = 49
# Pause between rounds of appends: a steady trickle leaves CPU for the faults.
_APPEND_PAUSE_S = 0.02


def _writer_options(without: list[str]) -> WriterOptions:
    protections = dataclasses.replace(Protections(), **{name: False for name in without})
    return WriterOptions(protections=protections)


def _connect(
    args: argparse.Namespace, stop: threading.Event, history: HistoryWriter
) -> StreamClient | None:
    while not stop.is_set():
        try:
            session = MetadataSession.connect(
                args.metadata, timeout_s=10.0, session_timeout_s=args.session_timeout
            )
            return StreamClient(session)
        except StreamError as e:
            history.record(ERROR, op="connect", error=type(e).__name__)
            stop.wait(1.0)
    return None


def _record_outcome(
    history: HistoryWriter, writer: StreamWriter, payload: str, invoked_term: int,
    future: concurrent.futures.Future[int],
) -> None:  # fmt: skip
    """Records an append's outcome with the writer's term when it came: a re-engaging writer
    acknowledges appends made in its old term in the new one, after its own recovery."""
    error = future.exception()
    if error is None:
        history.record(ACK, v=payload, e=future.result(), term=writer.term, invoked=invoked_term)
    else:
        history.record(FAIL, v=payload, term=writer.term, error=type(error).__name__)


def _append_until_stopped(
    writer: StreamWriter, name: str, counter: itertools.count[int], window: int,
    stop: threading.Event, history: HistoryWriter,
) -> None:  # fmt: skip
    """Keeps `window` appends in flight until one fails (the writer stopped: superseded, the
    stream sealed...) or `stop`. A stall shows in the history as appends never acknowledged."""
    pending: set[concurrent.futures.Future[int]] = set()
    try:
        while not stop.is_set():
            while len(pending) < window:
                payload = f"{name}-{next(counter)}"
                term = writer.term
                history.record(INVOKE, v=payload)
                try:
                    future = writer.append_async(payload.encode())
                except StreamError as e:
                    history.record(FAIL, v=payload, term=term, error=type(e).__name__)
                    return
                future.add_done_callback(
                    functools.partial(_record_outcome, history, writer, payload, term)
                )
                pending.add(future)
            done, pending = concurrent.futures.wait(
                pending, timeout=_APPEND_TIMEOUT_S, return_when=concurrent.futures.FIRST_COMPLETED
            )
            if any(f.exception() is not None for f in done):
                return
            stop.wait(_APPEND_PAUSE_S)
    finally:
        writer.abort()
        concurrent.futures.wait(pending, timeout=_APPEND_TIMEOUT_S)


def run_writer(args: argparse.Namespace, stop: threading.Event, history: HistoryWriter) -> None:
    rng = random.Random(args.seed)
    client = _connect(args, stop, history)
    if client is None:
        return
    options = _writer_options(args.without_protection)
    counter = itertools.count(1)
    try:
        while not stop.is_set():
            try:
                writer = client.open_writer(args.stream, reengage=args.reengage, options=options)
            except StreamError as e:
                history.record(ERROR, op="open", error=type(e).__name__, detail=str(e)[:200])
                if isinstance(e, StreamSealedError):
                    return
                stop.wait(rng.uniform(*_RETAKE_S))
                continue
            history.record(OPEN, term=writer.term)
            _append_until_stopped(writer, args.name, counter, args.window, stop, history)
            stop.wait(rng.uniform(*_RETAKE_S))
    finally:
        client.close()


class _Tail:
    """Where the tailing reader is: the next id it wants, in which segment (a stretch of ids
    read without a gap; a trim that overtakes the reader starts a new one)."""

    def __init__(self) -> None:
        self.segment = 0
        self.next_id = 0


def _keep_unless_broken(reader: StreamReader | None, error: StreamError) -> StreamReader | None:
    """A reader is opened again after an error, but not for the metadata being out of reach:
    opening needs the metadata, and the reader it has goes on with the fragments it knows."""
    return reader if isinstance(error, MetadataUnavailableError) else None


def _tail(
    client: StreamClient, name: str, tail: _Tail, stop: threading.Event, history: HistoryWriter
) -> None:
    reader = None
    while not stop.is_set():
        try:
            if reader is None:
                reader = client.open_reader(name, options=ReaderOptions())
            for entry in reader.tail(start=tail.next_id, timeout_s=1.0):
                history.record(READ, seg=tail.segment, e=entry.entry_id, v=entry.payload.decode())
                tail.next_id = entry.entry_id + 1
                if stop.is_set():
                    return
        except EntryTrimmedError as e:
            tail.segment += 1
            tail.next_id = int(e.context.get("first_entry_id", tail.next_id))
            history.record(ERROR, op="tail", error="EntryTrimmedError", restart=tail.next_id)
        except StreamError as e:
            history.record(ERROR, op="tail", error=type(e).__name__, detail=str(e)[:200])
            reader = _keep_unless_broken(reader, e)
            stop.wait(0.5)


def _reread(
    client: StreamClient, name: str, tail: _Tail, rng: random.Random, stop: threading.Event,
    history: HistoryWriter,
) -> None:  # fmt: skip
    """Reads back a random stretch of what the tail already saw, now and then: a later read of
    an entry must return the same bytes (from whichever bookie answers), and committed entries
    stay readable while ZooKeeper is out of reach."""
    reader = None
    count = 0
    while not stop.wait(_REREAD_EVERY_S):
        last = tail.next_id - 1
        if last < 0:
            continue
        first = rng.randint(max(0, last - _REREAD_SPAN), last)
        count += 1
        try:
            if reader is None:
                reader = client.open_reader(name, options=ReaderOptions())
            for entry in reader.read(first, min(last, first + _REREAD_MAX)):
                history.record(READ, seg=f"re{count}", e=entry.entry_id, v=entry.payload.decode())
        except EntryTrimmedError:
            continue
        except StreamError as e:
            history.record(ERROR, op="reread", error=type(e).__name__, detail=str(e)[:200])
            reader = _keep_unless_broken(reader, e)


def run_reader(args: argparse.Namespace, stop: threading.Event, history: HistoryWriter) -> None:
    client = _connect(args, stop, history)
    if client is None:
        return
    tail = _Tail()
    rereader = threading.Thread(
        target=_reread,
        args=(client, args.stream, tail, random.Random(args.seed), stop, history),
        name="reread",
        daemon=True,
    )
    rereader.start()
    try:
        _tail(client, args.stream, tail, stop, history)
    finally:
        stop.set()
        rereader.join()
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stream.sandbox.chaos.worker")
    parser.add_argument("role", choices=["writer", "reader"])
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--history", type=Path, required=True)
    parser.add_argument("--reengage", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=int, default=4, help="a writer's appends in flight")
    parser.add_argument("--without-protection", action="append", default=[])
    parser.add_argument("--session-timeout", type=float, default=10.0, help="ZooKeeper, seconds")
    args = parser.parse_args(argv)
    configure_logging(json=True, level="info")  # into the worker's log file
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    history = HistoryWriter(args.history, args.name)
    try:
        (run_writer if args.role == "writer" else run_reader)(args, stop, history)
    finally:
        history.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
