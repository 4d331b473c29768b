"""`streamctl bench append|tail|paced|sustained`: client benchmarks on a sandbox of bookie
processes started for the run (append and tail: or an existing cluster with `--existing`),
printing comparable figures. `paced` and `sustained` also read each process's CPU, peak memory
and disk writes from /proc over a measured window (so they need the sandbox's own bookies)."""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from stream.cli import arguments
from stream.cli.bench_memory import RSS_SAMPLE_INTERVAL_S, LatencySamples, rss_halves
from stream.cli.connect import tls_config
from stream.cli.output import console as output_console
from stream.cli.output import print_json, supports_json, wants_json
from stream.errors import InvalidArgumentError

# One append in this many has its latency measured (a done-callback on every future would
# itself cost a condition per append and distort the throughput).
_LATENCY_SAMPLE_EVERY = 8


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds `bench append`, `tail`, `paced` and `sustained` to `streamctl`."""
    bench = subparsers.add_parser("bench")
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
    _register_measured(sub)


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
    with _sandbox(args, secure) as cluster, _sandbox_client(cluster) as client:
        yield client


@contextlib.contextmanager
def _sandbox(
    args: argparse.Namespace, secure: bool = False, bookie_settings: dict[str, Any] | None = None
) -> Iterator[Any]:
    """Yields a started `SandboxCluster` of `args.bookies` bookies under `--data-dir` (a temp
    directory, removed afterwards, without it); stops it afterwards."""
    from stream.sandbox.cluster import SandboxCluster

    base = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="sk-bench-"))
    cluster = SandboxCluster(
        base / ("secure" if secure else "sandbox"),
        bookies=args.bookies,
        secure=secure,
        bookie_settings=bookie_settings,
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        if not args.data_dir:
            shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def _sandbox_client(cluster: Any) -> Iterator[Any]:
    """Yields a `StreamClient` of `cluster` (a writer's certificate when it serves TLS)."""
    from stream.client import StreamClient
    from stream.security.roles import Role

    tls = cluster.tls.client(Role.WRITER) if cluster.tls is not None else None
    with StreamClient.connect(
        cluster.metadata, tls=tls, metadata_auth_file=cluster.metadata_auth_file
    ) as client:
        yield client


# The pacer's shortest sleep.
_PACER_TICK_S = 0.001
# Pause before the paced run (several flush intervals of the sandbox bookies).
_SETTLE_S = 5.0


def _percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[index]


def _payload(size: int) -> bytes:
    """Returns the `size`-byte payload every append of a run carries (not all one byte)."""
    return bytes(range(256)) * (size // 256) + b"x" * (size % 256)


def _run_writer(
    writer: Any,
    payload: bytes,
    seconds: float,
    rate: float | None,
    latencies: LatencySamples,
    counts: list[int],
) -> None:
    """Appends `payload` for `seconds`; at `rate` entries/s when given. Adds `(sent, latency)`
    of one append in `_LATENCY_SAMPLE_EVERY` to `latencies` (perf_counter seconds; `sent` is
    the due time of a paced append).

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
                latencies.append((since, elapsed))

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
    payload = _payload(size)
    handles = []
    for _ in range(writers):
        name = f"bench-{uuid.uuid4().hex[:10]}"
        client.create_stream(name, ensemble=e, write_quorum=w, ack_quorum=a)
        handles.append(client.open_writer(name))
    latencies = LatencySamples()
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
    ordered = sorted(x * 1000 for _, x in latencies)
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


# ---------------------------------------------------------------- bench paced | sustained

# After the measured window the writer keeps appending this long, so that the window's last
# acknowledgments are not the final flush's.
_TAIL_S = 0.5
# Below this fraction of its target rate a paced run says it fell behind.
_KEPT_RATE = 0.95
# The disk test's write size (one fdatasync after each, like a journal's group commit).
_DISK_TEST_BLOCK = 1 << 20
# Written (not synced) to measure what new page-cache pages cost before a measured run.
_PAGE_CACHE_TEST_BYTES = 256 << 20
# Wake-ups each way of the wake-up test (about 0.2 s on the bench machine).
_WAKEUP_TEST_ROUNDS = 10_000


@dataclass
class ProcessFigures:
    """One process's share of a measured window: CPU (user + system), peak resident memory
    (VmHWM, the whole life of the process), the mean resident memory of the window's first
    and last halves (sampled every second: growth is last minus first) and bytes it wrote to
    storage."""

    process: str
    pid: int
    cpu_s: float
    cpu_us_per_entry: float
    peak_rss_mib: float
    written_mb: float
    # Times its threads went to sleep (voluntary context switches) per 1,000 acknowledged
    # entries: each is a wake-up, which costs `MeasuredRun.wakeup_cpu_us` of CPU.
    sleeps_per_1k_entries: float = float("nan")
    rss_first_half_mib: float = float("nan")
    rss_last_half_mib: float = float("nan")
    rss_growth_mib: float = float("nan")
    anon_growth_mib: float = float("nan")  # of RssAnon: a heap that keeps growing
    # The window's samples, in order (in the JSON only).
    rss_mib_samples: list[float] = field(default_factory=list)
    anon_mib_samples: list[float] = field(default_factory=list)


@dataclass
class DiskCeiling:
    """A sustained run against the disk: the disk's synced-write bandwidth measured in the
    same run, the bytes all bookies wrote per payload byte acknowledged, the append rate those
    allow, and the run's rate as a fraction of it."""

    synced_mb_per_s: float
    written_per_payload_byte: float
    ceiling_entries_per_s: float
    fraction: float


@dataclass
class MeasuredRun:
    """One measured window of appends by one writer to a sandbox of bookie processes: the
    rate acknowledged, CPU per acknowledged entry per process and in total, append latency
    (from the due time of each paced append, so a stalled sender shows), the largest latency
    of each second of the window, and, for a sustained run, the disk ceiling."""

    command: str
    size: int
    quorum: str
    journal: bool
    target_rate: float | None
    load_average: float
    seconds: float
    entries: int
    entries_per_s: float
    cpu_us_per_entry: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    latency_samples: int
    per_second_max_ms: list[float]
    processes: list[ProcessFigures]
    disk: DiskCeiling | None = None
    # CPU seconds per GiB written into new page-cache pages, measured before the run (see
    # `page_cache_cpu_s_per_gib`): what each bookie write pays for memory on this machine.
    page_cache_cpu_s_per_gib: float | None = None
    # CPU microseconds of one thread waking another on another CPU, measured before the run
    # (see `wakeup_cpu_us`): what each of the processes' sleeps costs on this machine.
    wakeup_cpu_us: float | None = None
    # The part of the client's CPU per entry that the bench's appending thread used: its
    # pacing (a paced run's ticks each end in a sleep) and the append calls it makes (the
    # library's work done on its caller's thread); the rest is the client's own threads.
    appending_thread_cpu_us_per_entry: float | None = None


@dataclass(frozen=True)
class _Snapshot:
    """CPU seconds, bytes written, resident bytes, resident anonymous bytes and sleeps of each
    process at one moment (perf_counter `at`), and the CPU seconds of the bench's appending
    thread."""

    at: float
    cpu: dict[int, float]
    written: dict[int, int]
    rss: dict[int, int]
    anon: dict[int, int]
    sleeps: dict[int, int]
    appending_cpu: float


def _positive_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected entries per second > 0, got {text!r}")
    return value


def _register_measured(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Adds `bench paced` and `bench sustained`: one writer's appends to a sandbox of bookie
    processes, measured over a window after a warm-up (the performance aims' figures)."""

    def measured(name: str, summary: str, seconds: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=summary)
        parser.add_argument("--bookies", type=int, default=3, help="sandbox bookies (default 3)")
        parser.add_argument("--data-dir", default=None, help="sandbox directory (default tmp)")
        parser.add_argument("--size", type=arguments.size, default=1024, help="default 1KiB")
        parser.add_argument("--quorum", default="e3w3a2", help="eEwWaA (default e3w3a2)")
        parser.add_argument(
            "--journal",
            choices=("on", "off"),
            default="on",
            help="on: entries in the journal, fsync before acknowledgment (default)",
        )
        parser.add_argument(
            "--warmup", type=arguments.duration, default=2.0, help="unmeasured first (2s)"
        )
        parser.add_argument(
            "--seconds", type=arguments.duration, default=seconds, help=f"measured ({seconds})"
        )
        supports_json(parser)
        return parser

    paced = measured("paced", "CPU per entry per process, latency, memory at a fixed rate", "10")
    paced.add_argument(
        "--rate",
        type=_positive_rate,
        default=20_000.0,
        help="appends/s on a fixed schedule (default 20000)",
    )
    paced.set_defaults(handler=_paced)
    sustained = measured(
        "sustained", "full speed against the disk's synced-write ceiling, memory", "60"
    )
    sustained.add_argument(
        "--disk-test-bytes",
        type=arguments.size,
        default=256 << 20,
        help="synced writes of the disk test, in 1 MiB writes (default 256MiB)",
    )
    sustained.set_defaults(handler=_sustained)


def _check_measured(args: argparse.Namespace) -> None:
    """Refuses a quorum the sandbox cannot place, before anything starts."""
    e, w, a = _parse_quorum(args.quorum)
    if not e >= w >= a >= 1:
        raise InvalidArgumentError("quorum needs ensemble >= write >= ack >= 1", quorum=args.quorum)
    if not e <= args.bookies:
        raise InvalidArgumentError(
            "the ensemble is larger than --bookies", quorum=args.quorum, bookies=args.bookies
        )
    if args.size < 1:
        raise InvalidArgumentError("--size must be >= 1", size=args.size)


def _paced(args: argparse.Namespace) -> int:
    _check_measured(args)
    _print_measured(args, _measured_run(args, "paced", args.rate))
    return 0


def _sustained(args: argparse.Namespace) -> int:
    _check_measured(args)
    if args.disk_test_bytes < _DISK_TEST_BLOCK:
        raise InvalidArgumentError("--disk-test-bytes must be at least 1MiB")
    _print_measured(args, _measured_run(args, "sustained", None))
    return 0


def _snapshot(pids: list[int], appending_tid: int) -> _Snapshot:
    from stream.sandbox.processes import (
        cpu_seconds,
        resident_bytes,
        sleeps,
        thread_cpu_seconds,
        write_bytes,
    )

    resident = {pid: resident_bytes(pid) for pid in pids}
    return _Snapshot(
        time.perf_counter(),
        {pid: cpu_seconds(pid) for pid in pids},
        {pid: write_bytes(pid) for pid in pids},
        {pid: rss for pid, (rss, _) in resident.items()},
        {pid: anon for pid, (_, anon) in resident.items()},
        {pid: sleeps(pid) for pid in pids},
        thread_cpu_seconds(os.getpid(), appending_tid),
    )


def _timed_test_file(
    directory: Path, blocks: int, *, sync: bool, clock: Callable[[], float]
) -> float:
    """Writes `blocks` incompressible 1 MiB blocks sequentially to a new file in `directory`
    (an fdatasync after each with `sync`), removes it, and returns the time `clock` measured
    across the writes."""
    path = directory / f"disk-test-{uuid.uuid4().hex[:8]}"
    block = os.urandom(_DISK_TEST_BLOCK)  # incompressible, whatever the filesystem
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        started = clock()
        for _ in range(blocks):
            view = memoryview(block)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fdatasync(fd)
        return clock() - started
    finally:
        os.close(fd)
        path.unlink()


def synced_write_mb_per_s(directory: Path, total: int) -> float:
    """Returns the MB/s of `total` bytes written sequentially to a new file in `directory`,
    1 MiB at a time with an fdatasync after each (as the journal makes entries durable); the
    file is removed."""
    blocks = total // _DISK_TEST_BLOCK
    elapsed = _timed_test_file(directory, blocks, sync=True, clock=time.perf_counter)
    return blocks * _DISK_TEST_BLOCK / elapsed / 1e6


def page_cache_cpu_s_per_gib(directory: Path, total: int) -> float:
    """Returns the CPU seconds per GiB (of this thread: user and system) that writing `total`
    bytes to a new file in `directory`, 1 MiB at a time and not synced, took; the file is
    removed. Every byte a bookie writes (journal, entry logs) lands in new page-cache pages,
    so their cost is part of its CPU per entry. Where the memory was in use before, it is
    about 0.2 s per GiB on the bench machine; in a VM whose memory the host backs only when
    the guest first touches it (after boot, or after the guest reported it free), each new
    page is a fault in the host and the cost was 2.4 s per GiB (docs/benchmarks.md)."""
    blocks = max(1, total // _DISK_TEST_BLOCK)
    used = _timed_test_file(directory, blocks, sync=False, clock=time.thread_time)
    return used / (blocks * _DISK_TEST_BLOCK / (1 << 30))


def wakeup_cpu_us(rounds: int) -> float:
    """Returns the CPU microseconds (of the whole process) per wake-up of a thread by a thread
    on another CPU: two threads, each held to a CPU of its own where there are two, wake each
    other through pipes `rounds` times each. On the bench VM a wake-up across CPUs cost 21-26
    us and one on the same CPU about 1 (a vCPU that went idle halts, and waking it goes
    through the host): the processes' sleeps are a part of their CPU per entry that depends on
    the machine (docs/benchmarks.md)."""
    allowed = sorted(os.sched_getaffinity(0))
    mine, theirs = allowed[0], allowed[-1]  # one CPU when only one is allowed
    ping_r, ping_w = os.pipe()
    pong_r, pong_w = os.pipe()

    def answer() -> None:
        os.sched_setaffinity(0, {theirs})  # this thread only
        for _ in range(rounds):
            os.read(ping_r, 1)
            os.write(pong_w, b"x")

    other = threading.Thread(target=answer, name="wakeup-test")
    os.sched_setaffinity(0, {mine})
    try:
        started = time.process_time()
        other.start()
        for _ in range(rounds):
            os.write(ping_w, b"x")
            os.read(pong_r, 1)
        other.join()
        used = time.process_time() - started
    finally:
        os.sched_setaffinity(0, allowed)
        for fd in (ping_r, ping_w, pong_r, pong_w):
            os.close(fd)
    return used / (2 * rounds) * 1e6


def _measured_run(args: argparse.Namespace, command: str, rate: float | None) -> MeasuredRun:
    """Runs one writer's appends on a fresh sandbox (the disk test first when sustained)."""
    from stream.sandbox.processes import peak_rss_bytes

    e, w, a = _parse_quorum(args.quorum)
    settings = {"journal_write_data": args.journal == "on", "log_level": "warning"}
    load_average = os.getloadavg()[0]
    with _sandbox(args, bookie_settings=settings) as cluster:
        page_cache = page_cache_cpu_s_per_gib(cluster.data_dir, _PAGE_CACHE_TEST_BYTES)
        wakeup = wakeup_cpu_us(_WAKEUP_TEST_ROUNDS)
        synced = (
            synced_write_mb_per_s(cluster.data_dir, args.disk_test_bytes)
            if command == "sustained"
            else None
        )
        with _sandbox_client(cluster) as client:
            name = f"bench-{uuid.uuid4().hex[:10]}"
            client.create_stream(name, ensemble=e, write_quorum=w, ack_quorum=a)
            processes = [("client", os.getpid())] + [(b.bookie_id, b.pid) for b in cluster.bookies]
            with client.open_writer(name) as writer:
                samples, window = _drive(writer, args, rate, [pid for _, pid in processes])
            peak = {pid: peak_rss_bytes(pid) for _, pid in processes}
    run = _figures(args, command, rate, load_average, samples, window, processes, peak, synced)
    run.page_cache_cpu_s_per_gib = round(page_cache, 2)
    run.wakeup_cpu_us = round(wakeup, 1)
    return run


def _drive(
    writer: Any, args: argparse.Namespace, rate: float | None, pids: list[int]
) -> tuple[LatencySamples, list[_Snapshot]]:
    """Appends with `_run_writer` for the warm-up, the window and a tail; returns the latency
    samples and the processes' snapshots through the window (its start, every
    `RSS_SAMPLE_INTERVAL_S`, its end)."""
    samples = LatencySamples()
    counts: list[int] = []
    seconds = args.warmup + args.seconds + _TAIL_S
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # The appending thread, by its native id: its CPU is told apart from the client's.
        appending_tid = pool.submit(threading.get_native_id).result()
        started = time.perf_counter()
        driving = pool.submit(
            _run_writer, writer, _payload(args.size), seconds, rate, samples, counts
        )
        time.sleep(max(0.0, started + args.warmup - time.perf_counter()))
        window = [_snapshot(pids, appending_tid)]
        end = started + args.warmup + args.seconds
        while (left := end - time.perf_counter()) > 0:
            time.sleep(min(left, RSS_SAMPLE_INTERVAL_S))
            window.append(_snapshot(pids, appending_tid))
        driving.result()  # a writer that failed fails the run, its figures unprinted
    return samples, window


def _figures(
    args: argparse.Namespace,
    command: str,
    rate: float | None,
    load_average: float,
    samples: Iterable[tuple[float, float]],
    window: list[_Snapshot],
    processes: list[tuple[str, int]],
    peak: dict[int, int],
    synced_mb_per_s: float | None,
) -> MeasuredRun:
    """Computes a window's figures. Acknowledged entries are counted from the sampled ones
    acknowledged within the window (acknowledgments come in entry order, one in
    `_LATENCY_SAMPLE_EVERY` is sampled); latencies are those of appends due within it."""
    first, last = window[0], window[-1]
    seconds = last.at - first.at
    acked = _LATENCY_SAMPLE_EVERY * sum(
        1 for sent, latency in samples if first.at <= sent + latency < last.at
    )
    due = [(sent, latency) for sent, latency in samples if first.at <= sent < last.at]
    ordered = sorted(latency * 1000 for _, latency in due)
    # Whole seconds: the window's last fraction of a second joins its last second.
    per_second = [0.0] * max(1, round(seconds))
    for sent, latency in due:
        second = min(int(sent - first.at), len(per_second) - 1)
        per_second[second] = max(per_second[second], latency * 1000)
    figures = [
        ProcessFigures(
            process=name,
            pid=pid,
            cpu_s=round(last.cpu[pid] - first.cpu[pid], 2),
            cpu_us_per_entry=_per_entry(last.cpu[pid] - first.cpu[pid], acked),
            peak_rss_mib=round(peak[pid] / (1 << 20), 1),
            written_mb=round((last.written[pid] - first.written[pid]) / 1e6, 1),
            sleeps_per_1k_entries=_per_1k(last.sleeps[pid] - first.sleeps[pid], acked),
            rss_first_half_mib=round(halves[0] / (1 << 20), 1),
            rss_last_half_mib=round(halves[1] / (1 << 20), 1),
            rss_growth_mib=round((halves[1] - halves[0]) / (1 << 20), 1),
            anon_growth_mib=round((anon[1] - anon[0]) / (1 << 20), 1),
            rss_mib_samples=[round(snapshot.rss[pid] / (1 << 20), 1) for snapshot in window],
            anon_mib_samples=[round(snapshot.anon[pid] / (1 << 20), 1) for snapshot in window],
        )
        for name, pid in processes
        for halves in [rss_halves([snapshot.rss[pid] for snapshot in window])]
        for anon in [rss_halves([snapshot.anon[pid] for snapshot in window])]
    ]
    entries_per_s = acked / seconds
    disk = None
    if synced_mb_per_s is not None:
        bookies_written = sum(last.written[p] - first.written[p] for _, p in processes[1:])
        per_payload = bookies_written / max(1, acked * args.size)
        ceiling = synced_mb_per_s * 1e6 / (per_payload * args.size) if per_payload else 0.0
        disk = DiskCeiling(
            synced_mb_per_s=round(synced_mb_per_s, 1),
            written_per_payload_byte=round(per_payload, 2),
            ceiling_entries_per_s=round(ceiling),
            fraction=round(entries_per_s / ceiling, 3) if ceiling else 0.0,
        )
    return MeasuredRun(
        command=command,
        size=args.size,
        quorum=args.quorum,
        journal=args.journal == "on",
        target_rate=rate,
        load_average=round(load_average, 2),
        seconds=round(seconds, 2),
        entries=acked,
        entries_per_s=round(entries_per_s),
        cpu_us_per_entry=_per_entry(sum(last.cpu.values()) - sum(first.cpu.values()), acked),
        p50_ms=round(_percentile(ordered, 0.5), 2),
        p99_ms=round(_percentile(ordered, 0.99), 2),
        p999_ms=round(_percentile(ordered, 0.999), 2),
        max_ms=round(ordered[-1], 2) if ordered else float("nan"),
        latency_samples=len(ordered),
        per_second_max_ms=[round(v, 1) for v in per_second],
        processes=figures,
        disk=disk,
        appending_thread_cpu_us_per_entry=_per_entry(
            last.appending_cpu - first.appending_cpu, acked
        ),
    )


def _per_entry(cpu_s: float, entries: int) -> float:
    return round(cpu_s / entries * 1e6, 2) if entries else float("nan")


def _per_1k(count: int, entries: int) -> float:
    # A thread that ended during the window takes its count along: never below zero.
    return round(max(count, 0) / entries * 1000, 1) if entries else float("nan")


def _print_measured(args: argparse.Namespace, run: MeasuredRun) -> None:
    """Prints `run` as one JSON line with `--output json`, as tables otherwise."""
    if wants_json(args):
        print_json(asdict(run))
        return
    out = output_console()
    target = "full speed" if run.target_rate is None else f"{run.target_rate:,.0f}/s"
    journal = "journal on" if run.journal else "journal off"
    out.print(
        f"streamctl bench {run.command}: {run.size} B, {run.quorum}, {journal}, target "
        f"{target}; {run.entries:,} acknowledged in {run.seconds} s: "
        f"{run.entries_per_s:,}/s (load average {run.load_average})",
        highlight=False,
    )
    if run.page_cache_cpu_s_per_gib is not None:
        # Compare it before comparing CPU figures across runs or days (docs/benchmarks.md).
        out.print(
            f"new page-cache pages: {run.page_cache_cpu_s_per_gib:.2f} s of CPU per GiB written "
            "(about 0.2 where the machine's memory was in use before; much more in a VM whose "
            "host backs memory only when it is first touched, and every bookie write pays it)",
            highlight=False,
        )
    if run.wakeup_cpu_us is not None:
        out.print(
            f"a thread's wake-up by another CPU: {run.wakeup_cpu_us:.1f} us of CPU (the table's "
            "sleeps each end in one; about 1 us on one CPU)",
            highlight=False,
        )
    if run.target_rate is not None and run.entries_per_s < _KEPT_RATE * run.target_rate:
        # Latency then measures the backlog, and CPU per entry a different batching.
        out.print(
            f"behind schedule: {run.entries_per_s / run.target_rate:.0%} of the target rate",
            highlight=False,
        )
    table = Table(
        title="CPU and sleeps per acknowledged entry, memory (RSS: window halves), disk writes"
    )
    columns = ("process", "pid", "CPU s", "CPU us/entry", "sleeps/1k entries", "peak RSS MiB")
    for column in (*columns, "RSS 1st half", "RSS 2nd half", "RSS growth", "anon growth"):
        table.add_column(column, justify="right")
    table.add_column("written MB", justify="right")
    for p in run.processes:
        table.add_row(
            p.process,
            str(p.pid),
            f"{p.cpu_s:.2f}",
            f"{p.cpu_us_per_entry:.1f}",
            f"{p.sleeps_per_1k_entries:.0f}",
            f"{p.peak_rss_mib:.0f}",
            f"{p.rss_first_half_mib:.1f}",
            f"{p.rss_last_half_mib:.1f}",
            f"{p.rss_growth_mib:+.1f}",
            f"{p.anon_growth_mib:+.1f}",
            f"{p.written_mb:.0f}",
        )
    total_cpu = sum(p.cpu_s for p in run.processes)
    total_written = sum(p.written_mb for p in run.processes)
    total_sleeps = sum(p.sleeps_per_1k_entries for p in run.processes)
    table.add_row(
        "total",
        "",
        f"{total_cpu:.2f}",
        f"{run.cpu_us_per_entry:.1f}",
        f"{total_sleeps:.0f}",
        *([""] * 5),
        f"{total_written:.0f}",
    )
    out.print(table)
    if run.appending_thread_cpu_us_per_entry is not None:
        out.print(
            f"of the client's CPU, the bench's appending thread (its pacing and append calls): "
            f"{run.appending_thread_cpu_us_per_entry:.1f} us/entry",
            highlight=False,
        )
    since = "sent" if run.target_rate is None else "due"
    latency = Table(title=f"append latency (ms, from the time each append was {since})")
    for column in ("p50", "p99", "p999", "max", "samples"):
        latency.add_column(column, justify="right")
    latency.add_row(
        *(f"{v:.1f}" for v in (run.p50_ms, run.p99_ms, run.p999_ms, run.max_ms)),
        str(run.latency_samples),
    )
    out.print(latency)
    out.print(
        "largest latency of each second (ms): "
        + " ".join(f"{v:.0f}" for v in run.per_second_max_ms),
        highlight=False,
    )
    if run.disk is not None:
        disk = Table(title="sustained rate against the disk's ceiling")
        for column in ("disk synced MB/s", "written B / payload B", "ceiling/s", "rate / ceiling"):
            disk.add_column(column, justify="right")
        disk.add_row(
            f"{run.disk.synced_mb_per_s:.0f}",
            f"{run.disk.written_per_payload_byte:.2f}",
            f"{run.disk.ceiling_entries_per_s:,.0f}",
            f"{run.disk.fraction:.2f}",
        )
        out.print(disk)
