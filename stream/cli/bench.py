"""`streamctl bench append|tail`: client benchmarks on a sandbox of bookie processes started for
the run (or an existing cluster with `--existing`), printing comparable figures."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from stream.cli import arguments
from stream.cli.connect import tls_config
from stream.errors import InvalidArgumentError

# One append in this many has its latency measured (a done-callback on every future would
# itself cost a condition per append and distort the throughput).
_LATENCY_SAMPLE_EVERY = 8


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds `bench append` and `bench tail` to `streamctl`."""
    bench = subparsers.add_parser("bench", help="client benchmarks on a sandbox")
    sub = bench.add_subparsers(dest="bench_command", metavar="SUBCOMMAND", required=True)

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--bookies", type=int, default=3, help="sandbox bookies (default 3)")
        parser.add_argument(
            "--existing", action="store_true", help="use the cluster at --metadata instead"
        )
        parser.add_argument("--data-dir", default=None, help="sandbox directory (default tmp)")
        parser.add_argument("--json", action="store_true", help="print JSON lines too")
        parser.add_argument(
            "--tls-mode",
            choices=("off", "on", "both"),
            default="off",
            help="sandbox bookies with mutual TLS (a writer's certificate); both: every run "
            "without, then with (with --existing: the --tls-* options decide)",
        )

    append = sub.add_parser("append", help="append throughput and latency")
    common(append)
    append.add_argument(
        "--sizes", type=arguments.sizes, default="100,1024,16384", help="entry sizes, e.g. 100,1KiB"
    )
    append.add_argument("--writers", default="1,8", help="concurrent writers (one stream each)")
    append.add_argument("--quorums", default="e3w3a2,e3w2a2", help="eEwWaA list")
    append.add_argument("--seconds", type=float, default=5.0, help="appending time per run")
    append.add_argument(
        "--paced",
        action="store_true",
        help="also run 1 KiB e3w3a2 x1 at half the measured rate (latency at half load), "
        "once the bookies had time to flush what the runs at full speed left behind",
    )
    append.add_argument(
        "--paced-rate",
        type=float,
        default=None,
        help="entries/s of the --paced run (default: half the measured 1 KiB e3w3a2 x1 rate)",
    )
    append.set_defaults(handler=_append)

    tail = sub.add_parser("tail", help="throughput of a reader catching up")
    common(tail)
    tail.add_argument("--total-bytes", type=arguments.size, default=1 << 30, help="default 1GiB")
    tail.add_argument("--entry-size", type=arguments.size, default=16384, help="default 16KiB")
    tail.add_argument("--quorum", default="e3w3a2")
    tail.set_defaults(handler=_tail)


@dataclass
class AppendResult:
    """One append run's figures."""

    size: int
    writers: int
    quorum: str
    entries: int
    seconds: float
    entries_per_s: float
    mb_per_s: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    target_rate: float | None = None
    tls: bool = False


def _parse_quorum(text: str) -> tuple[int, int, int]:
    try:
        e, rest = text.lower().lstrip("e").split("w")
        w, a = rest.split("a")
        return int(e), int(w), int(a)
    except ValueError:
        raise InvalidArgumentError("quorum must look like e3w3a2", quorum=text) from None


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InvalidArgumentError(f"{what} must be a comma-separated list of ints") from None
    if not values or any(v < 1 for v in values):
        raise InvalidArgumentError(f"{what} must be ints >= 1", value=text)
    return values


def _tls_modes(args: argparse.Namespace) -> list[bool]:
    """Returns whether each cluster of the run serves TLS, in order."""
    return {"off": [False], "on": [True], "both": [False, True]}[args.tls_mode]


@contextlib.contextmanager
def _client(args: argparse.Namespace, secure: bool = False) -> Iterator[Any]:
    """Yields a `StreamClient` of a fresh sandbox (stopped afterwards; with `secure`, mutual
    TLS and a writer's certificate), or of the existing cluster with `--existing`."""
    from stream.client import StreamClient

    if args.existing:
        with StreamClient.connect(
            args.metadata, tls=tls_config(args), metadata_auth_file=args.metadata_auth_file
        ) as client:
            yield client
        return
    from stream.sandbox.cluster import SandboxCluster
    from stream.security.roles import Role

    base = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="sk-bench-"))
    cluster = SandboxCluster(
        base / ("secure" if secure else "sandbox"), bookies=args.bookies, secure=secure
    )
    cluster.start()
    try:
        tls = cluster.tls.client(Role.WRITER) if cluster.tls is not None else None
        with StreamClient.connect(
            cluster.metadata, tls=tls, metadata_auth_file=cluster.metadata_auth_file
        ) as client:
            yield client
    finally:
        cluster.stop()
        if not args.data_dir:
            shutil.rmtree(base, ignore_errors=True)


# The pacer's shortest sleep.
_PACER_TICK_S = 0.001
# Pause before the paced run (several flush intervals of the sandbox bookies).
_SETTLE_S = 5.0


def _percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[index]


def _run_writer(
    writer: Any,
    payload: bytes,
    seconds: float,
    rate: float | None,
    latencies: list[float],
    counts: list[int],
) -> None:
    """Appends `payload` for `seconds`; at `rate` entries/s when given.

    Paced runs follow a fixed schedule (append `n` is due at `start + n / rate`) and measure
    each sampled latency from its due time, not from when the append was actually made: a
    pacer that fell behind (descheduled, or blocked by a full window) then shows as latency
    instead of silently sending later (coordinated omission). The pacer sleeps until the next
    due time (at least a millisecond) rather than polling, and catches up on missed slots in
    order."""
    lock = threading.Lock()
    count = 0
    started = time.perf_counter()
    deadline = started + seconds
    perf = time.perf_counter
    sleep = time.sleep
    interval = None if rate is None else 1.0 / rate

    def sampled(since: float) -> Any:
        def done(_: Any) -> None:
            elapsed = perf() - since
            with lock:
                latencies.append(elapsed)

        return done

    append = writer.append_async
    if interval is None:
        # Full speed: one sampled append, then the rest of its group, with no clock reads or
        # arithmetic in between (the bench's own loop must not be what limits the rate).
        rest = range(_LATENCY_SAMPLE_EVERY - 1)
        while perf() < deadline:
            append(payload).add_done_callback(sampled(perf()))
            for _ in rest:
                append(payload)
            count += _LATENCY_SAMPLE_EVERY
    else:
        while True:
            due = started + count * interval
            if due >= deadline:
                break
            now = perf()
            if due > now:
                # At least a tick: a pacer waking once per entry (90 us apart at 11k/s) costs
                # more CPU in wake-ups and GIL hand-overs than the appends themselves. Entries
                # a tick makes late count that lateness in their latency (measured from due).
                sleep(max(due - now, _PACER_TICK_S))
            future = append(payload)
            if count % _LATENCY_SAMPLE_EVERY == 0:
                future.add_done_callback(sampled(due))
            count += 1
    writer.flush()
    counts.append(count)


def _append_run(
    client: Any, size: int, writers: int, quorum: str, seconds: float, rate: float | None
) -> AppendResult:
    e, w, a = _parse_quorum(quorum)
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    handles = []
    for _ in range(writers):
        name = f"bench-{uuid.uuid4().hex[:10]}"
        client.create_stream(name, ensemble=e, write_quorum=w, ack_quorum=a)
        handles.append(client.open_writer(name))
    latencies: list[float] = []
    counts: list[int] = []
    per_writer_rate = None if rate is None else rate / writers
    threads = [
        threading.Thread(
            target=_run_writer, args=(h, payload, seconds, per_writer_rate, latencies, counts)
        )
        for h in handles
    ]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    for h in handles:
        h.close()
    total = sum(counts)
    ordered = sorted(x * 1000 for x in latencies)
    return AppendResult(
        size=size,
        writers=writers,
        quorum=quorum,
        entries=total,
        seconds=round(elapsed, 2),
        entries_per_s=round(total / elapsed),
        mb_per_s=round(total * size / elapsed / 1e6, 1),
        p50_ms=round(_percentile(ordered, 0.5), 2),
        p99_ms=round(_percentile(ordered, 0.99), 2),
        p999_ms=round(_percentile(ordered, 0.999), 2),
        target_rate=rate,
    )


def _append(args: argparse.Namespace) -> int:
    writer_counts = _int_list(args.writers, "--writers")
    quorums = [q.strip() for q in args.quorums.split(",") if q.strip()]
    for q in quorums:
        _parse_quorum(q)
    if not args.seconds > 0:
        raise InvalidArgumentError("--seconds must be > 0")
    if args.paced_rate is not None and not args.paced_rate > 0:
        raise InvalidArgumentError("--paced-rate must be > 0", value=args.paced_rate)
    console = Console(width=140)
    table = Table(title="streamctl bench append")
    for column in (
        "size B",
        "writers",
        "quorum",
        "entries/s",
        "MB/s",
        "p50 ms",
        "p99 ms",
        "p999 ms",
        "rate",
        "TLS",
    ):
        table.add_column(column, justify="right")
    results: list[AppendResult] = []
    for secure in _tls_modes(args):
        with _client(args, secure) as client:
            results.extend(_append_runs(args, client, quorums, writer_counts, console, secure))
    for r in results:
        table.add_row(
            str(r.size),
            str(r.writers),
            r.quorum,
            str(r.entries_per_s),
            str(r.mb_per_s),
            str(r.p50_ms),
            str(r.p99_ms),
            str(r.p999_ms),
            "max" if r.target_rate is None else f"{r.target_rate:.0f}/s",
            "on" if r.tls else "off",
        )
    console.print(table)
    if args.json:
        for r in results:
            sys.stdout.write(json.dumps(asdict(r)) + "\n")  # one line each, never wrapped
    return 0


def _append_runs(
    args: argparse.Namespace,
    client: Any,
    quorums: list[str],
    writer_counts: list[int],
    console: Console,
    secure: bool,
) -> list[AppendResult]:
    """Runs every append configuration of `args` on one cluster; returns their figures."""
    results = []
    for quorum in quorums:
        for size in args.sizes:
            for writers in writer_counts:
                result = _append_run(client, size, writers, quorum, args.seconds, None)
                result.tls = secure
                results.append(result)
                console.print(f"  {asdict(result)}", highlight=False)
    if args.paced:
        rate = args.paced_rate
        if rate is None:
            peak = next(
                (r for r in results if (r.size, r.writers, r.quorum) == (1024, 1, "e3w3a2")),
                None,
            ) or _append_run(client, 1024, 1, "e3w3a2", args.seconds, None)
            rate = max(1.0, peak.entries_per_s / 2)
        # A run at full speed leaves the bookies' write caches full and their flushes
        # behind: latency at half load is measured after that backlog, not during it.
        time.sleep(_SETTLE_S)
        result = _append_run(client, 1024, 1, "e3w3a2", args.seconds, rate)
        result.tls = secure
        results.append(result)
    return results


def _tail(args: argparse.Namespace) -> int:
    if args.total_bytes < args.entry_size or args.entry_size < 1:
        raise InvalidArgumentError("--total-bytes must be >= --entry-size >= 1")
    e, w, a = _parse_quorum(args.quorum)
    count = args.total_bytes // args.entry_size
    payload = b"t" * args.entry_size
    console = Console(width=140)
    with _client(args, _tls_modes(args)[-1]) as client:
        name = f"bench-tail-{uuid.uuid4().hex[:10]}"
        client.create_stream(name, ensemble=e, write_quorum=w, ack_quorum=a)
        started = time.perf_counter()
        with client.open_writer(name) as writer:
            for _ in range(count):
                writer.append_async(payload)
            writer.flush()
        write_s = time.perf_counter() - started
        console.print(
            f"wrote {count} entries ({count * args.entry_size / 1e6:.0f} MB) in {write_s:.1f}s"
        )
        reader = client.open_reader(name)
        started = time.perf_counter()
        read = 0
        read_bytes = 0
        for entry in reader.tail("earliest", timeout_s=2.0):
            read += 1
            read_bytes += len(entry.payload)
            if read == count:
                break
        read_s = time.perf_counter() - started
    table = Table(title="streamctl bench tail (catch-up)")
    for column in ("entries", "entry B", "quorum", "seconds", "entries/s", "MB/s"):
        table.add_column(column, justify="right")
    figures = {
        "entries": read,
        "entry_bytes": args.entry_size,
        "quorum": args.quorum,
        "seconds": round(read_s, 2),
        "entries_per_s": round(read / read_s),
        "mb_per_s": round(read_bytes / read_s / 1e6, 1),
    }
    table.add_row(*(str(v) for v in figures.values()))
    console.print(table)
    if args.json:
        sys.stdout.write(json.dumps(figures) + "\n")
    return 0 if read == count else 1
