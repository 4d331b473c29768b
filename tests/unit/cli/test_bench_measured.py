"""`streamctl bench paced|sustained`: their options, what they refuse before starting a
sandbox, and the figures and output they make of a window's measurements (no processes)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from stream.cli.bench import (
    MeasuredRun,
    _drive,
    _figures,
    _print_measured,
    _Snapshot,
    page_cache_cpu_s_per_gib,
    wakeup_cpu_us,
)
from stream.cli.bench_memory import LatencySamples, rss_halves
from stream.cli.main import build_parser, main
from stream.sandbox.processes import cpu_seconds, sleeps, thread_cpu_seconds


def _usage_error(*argv: str) -> bool:
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(list(argv))
    return refused.value.code == 2


def test_paced_and_sustained_take_issue_22s_defaults_and_units() -> None:
    paced = build_parser().parse_args(["bench", "paced"])
    assert (paced.rate, paced.seconds, paced.warmup) == (20_000.0, 10.0, 2.0)
    assert (paced.size, paced.quorum, paced.journal, paced.bookies) == (1024, "e3w3a2", "on", 3)
    latency = build_parser().parse_args(
        ["bench", "paced", "--rate", "15000", "--seconds", "1m", "--size", "4KiB"]
    )
    assert (latency.rate, latency.seconds, latency.size) == (15_000.0, 60.0, 4096)
    sustained = build_parser().parse_args(["bench", "sustained", "--journal", "off"])
    assert (sustained.seconds, sustained.disk_test_bytes, sustained.journal) == (
        60.0,
        256 << 20,
        "off",
    )
    for bad in ("0", "-5", "fast", "inf"):
        assert _usage_error("bench", "paced", "--rate", bad)
    assert _usage_error("bench", "sustained", "--seconds", "0")
    assert _usage_error("bench", "paced", "--journal", "sometimes")


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "paced", "--bookies", "2"],  # e3 needs three bookies
        ["bench", "paced", "--quorum", "e3w4a2"],
        ["bench", "paced", "--quorum", "three"],
        ["bench", "sustained", "--disk-test-bytes", "4KiB"],
    ],
)
def test_what_cannot_run_is_refused_before_a_sandbox_starts(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # No --metadata and no ZooKeeper: anything that got as far as a sandbox would take its
    # time and print figures; a refusal is an error line at once.
    assert main(argv) != 0
    captured = capsys.readouterr()
    assert "error" in captured.err and captured.out == ""


def _window() -> tuple[list[tuple[float, float]], list[_Snapshot]]:
    """Two seconds of samples at 1,000 sampled appends/s (8,000 appends/s), each taking 2 ms
    but for one of 40 ms in the second second; client pid 1, bookies 2 and 3. The client's
    heap grows by 1 MiB a second; bookie-3's resident set grows by mapped file pages only."""
    mib = 1 << 20
    first = _Snapshot(
        100.0,
        {1: 10.0, 2: 20.0, 3: 30.0},
        {1: 0, 2: 1000, 3: 1000},
        {1: 50 * mib, 2: 90 * mib, 3: 90 * mib},
        {1: 30 * mib, 2: 40 * mib, 3: 40 * mib},
        {1: 500, 2: 900, 3: 900},
        4.0,  # the appending thread, of client 1's 10.0
    )
    middle = _Snapshot(
        101.0,
        {1: 10.08, 2: 20.04, 3: 30.04},
        {1: 0, 2: 1000, 3: 1000},
        {1: 51 * mib, 2: 91 * mib, 3: 92 * mib},
        {1: 31 * mib, 2: 41 * mib, 3: 40 * mib},
        {1: 1500, 2: 2900, 3: 1900},
        4.02,
    )
    written = 1000 + 16_384_000
    last = _Snapshot(
        102.0,
        {1: 10.16, 2: 20.08, 3: 30.08},
        {1: 0, 2: written, 3: written},
        {1: 52 * mib, 2: 90 * mib, 3: 94 * mib},
        {1: 32 * mib, 2: 40 * mib, 3: 40 * mib},
        # bookie-2 lost a thread that had slept more than the others' since: no negative count.
        {1: 2500, 2: 4900, 3: 800},
        4.048,
    )
    samples = [(99.5, 0.002)]  # before the window: neither counted nor timed
    # Acknowledged at 100.0005 ... 101.9995, the first two due before the window.
    samples += [(99.9985 + i / 1000, 0.002) for i in range(2000)]
    samples[1500] = (samples[1500][0], 0.040)
    samples.append((101.9995, 0.010))  # due inside, acknowledged after the window
    return samples, [first, middle, last]


def _measured(command: str, synced: float | None) -> MeasuredRun:
    samples, window = _window()
    args = build_parser().parse_args(["bench", command])
    processes = [("client", 1), ("bookie-1", 2), ("bookie-2", 3)]
    peak = {1: 100 << 20, 2: 200 << 20, 3: 300 << 20}
    rate = 8000.0 if command == "paced" else None
    return _figures(args, command, rate, 1.5, samples, window, processes, peak, synced)


def test_a_window_gives_rate_cpu_per_entry_latency_and_each_seconds_maximum() -> None:
    run = _measured("paced", None)
    # 2,000 sampled acknowledgments in the window stand for 8 appends each.
    assert (run.entries, run.seconds, run.entries_per_s) == (16_000, 2.0, 8000)
    by_name = {p.process: p for p in run.processes}
    assert by_name["client"].cpu_us_per_entry == 10.0  # 0.16 s / 16,000
    assert run.appending_thread_cpu_us_per_entry == 3.0  # 0.048 s of the client's 0.16
    assert by_name["bookie-1"].cpu_us_per_entry == 5.0
    assert run.cpu_us_per_entry == 20.0
    assert by_name["bookie-2"].peak_rss_mib == 300.0
    assert by_name["bookie-1"].written_mb == 16.4
    # 2,000 and 4,000 sleeps over 16,000 entries.
    assert by_name["client"].sleeps_per_1k_entries == 125.0
    assert by_name["bookie-1"].sleeps_per_1k_entries == 250.0
    assert by_name["bookie-2"].sleeps_per_1k_entries == 0.0
    assert (run.p50_ms, run.p99_ms, run.max_ms) == (2.0, 2.0, 40.0)
    assert run.latency_samples == 1999
    assert run.per_second_max_ms == [2.0, 40.0]
    assert run.disk is None


def test_resident_memory_is_sampled_through_the_window_so_that_growth_shows() -> None:
    by_name = {p.process: p for p in _measured("paced", None).processes}
    # Three samples: the first half is the first one, the last half the last one.
    client = by_name["client"]
    assert (client.rss_first_half_mib, client.rss_last_half_mib) == (50.0, 52.0)
    assert (client.rss_growth_mib, client.anon_growth_mib) == (2.0, 2.0)
    assert (client.rss_mib_samples, client.anon_mib_samples) == ([50, 51, 52], [30, 31, 32])
    assert by_name["bookie-1"].rss_growth_mib == 0.0  # a bump in the middle is no growth
    bookie = by_name["bookie-2"]  # pages of its mapped files, its heap as it was
    assert (bookie.rss_growth_mib, bookie.anon_growth_mib) == (4.0, 0.0)
    assert rss_halves([4, 6, 8, 8]) == (5.0, 8.0)
    assert rss_halves([7]) == (7.0, 7.0)


def test_latency_samples_take_about_16_bytes_each() -> None:
    # A list of (sent, latency) tuples takes about 130 bytes a sample: a 60 s run's would
    # pass for the client's growth.
    tracemalloc.start()
    try:
        samples = LatencySamples()
        for i in range(10_000):
            samples.append((float(i), i / 1000))
        assert tracemalloc.get_traced_memory()[0] < 24 * 10_000
    finally:
        tracemalloc.stop()
    assert len(samples) == 10_000 and list(samples)[3] == (3.0, 0.003)


def test_json_for_scripts_and_tables_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    run = _measured("sustained", 328.0)
    _print_measured(build_parser().parse_args(["--output", "json", "bench", "sustained"]), run)
    (line,) = capsys.readouterr().out.splitlines()
    figures = json.loads(line)
    assert figures["entries_per_s"] == 8000 and figures["per_second_max_ms"] == [2.0, 40.0]
    assert [p["process"] for p in figures["processes"]] == ["client", "bookie-1", "bookie-2"]
    assert figures["disk"]["written_per_payload_byte"] == 2.0
    assert figures["appending_thread_cpu_us_per_entry"] == 3.0
    _print_measured(build_parser().parse_args(["bench", "sustained"]), run)
    text = capsys.readouterr().out
    assert figures["processes"][0]["rss_growth_mib"] == 2.0
    for expected in ("CPU us/entry", "bookie-2", "p999", "rate / ceiling", "2 40", "+2.0"):
        assert expected in text
    assert "the bench's appending thread (its pacing and append calls): 3.0 us/entry" in text


def test_a_paced_run_that_fell_behind_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    # Its latencies then measure the backlog: the reader must not take them for the target's.
    args = build_parser().parse_args(["bench", "paced"])
    kept = _measured("paced", None)
    _print_measured(args, kept)
    assert "behind schedule" not in capsys.readouterr().out
    kept.target_rate = 10_000.0
    _print_measured(args, kept)
    assert "behind schedule: 80% of the target rate" in capsys.readouterr().out


def test_the_cost_of_new_page_cache_pages_is_measured_and_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Written, not synced, and removed: the run's directory holds only the sandbox after it.
    cost = page_cache_cpu_s_per_gib(tmp_path, 8 << 20)
    assert 0.0 < cost < 60.0 and list(tmp_path.iterdir()) == []
    run = _measured("paced", None)
    run.page_cache_cpu_s_per_gib = 2.4
    _print_measured(build_parser().parse_args(["--output", "json", "bench", "paced"]), run)
    assert json.loads(capsys.readouterr().out)["page_cache_cpu_s_per_gib"] == 2.4
    _print_measured(build_parser().parse_args(["bench", "paced"]), run)
    assert "new page-cache pages: 2.40 s of CPU per GiB written" in capsys.readouterr().out


def test_what_a_wake_up_costs_is_measured_and_printed(capsys: pytest.CaptureFixture[str]) -> None:
    slept = sleeps(os.getpid())
    time.sleep(0.01)
    assert sleeps(os.getpid()) > slept
    affinity = os.sched_getaffinity(0)
    cost = wakeup_cpu_us(200)
    # The test holds this thread to one CPU and gives it back.
    assert 0.0 < cost < 1000.0 and os.sched_getaffinity(0) == affinity
    run = _measured("paced", None)
    run.wakeup_cpu_us = 9.8
    _print_measured(build_parser().parse_args(["--output", "json", "bench", "paced"]), run)
    figures = json.loads(capsys.readouterr().out)
    assert figures["wakeup_cpu_us"] == 9.8
    assert [p["sleeps_per_1k_entries"] for p in figures["processes"]] == [125.0, 250.0, 0.0]
    _print_measured(build_parser().parse_args(["bench", "paced"]), run)
    text = capsys.readouterr().out
    assert "a thread's wake-up by another CPU: 9.8 us of CPU" in text
    assert "sleeps/1k entries" in text


def test_a_threads_cpu_is_its_own_not_its_processs() -> None:
    # The client's figure splits into the bench's appending thread and the rest: the thread's
    # CPU must not include what the process's other threads used meanwhile.
    mine = threading.get_native_id()
    busy_until = time.thread_time() + 0.3

    def burn() -> None:
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass

    process_before = cpu_seconds(os.getpid())
    mine_before = thread_cpu_seconds(os.getpid(), mine)
    other = threading.Thread(target=burn)
    other.start()
    other.join()
    assert cpu_seconds(os.getpid()) - process_before >= 0.2
    assert thread_cpu_seconds(os.getpid(), mine) - mine_before < 0.1
    while time.thread_time() < busy_until:
        pass
    assert thread_cpu_seconds(os.getpid(), mine) - mine_before >= 0.2


class _InstantWriter:
    """A writer whose appends are acknowledged at once: the bench's appending thread spins."""

    def append_async(self, payload: bytes) -> concurrent.futures.Future[int]:
        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        done.set_result(0)
        return done

    def flush(self) -> None:
        pass


def test_the_appending_threads_cpu_is_sampled_from_that_thread() -> None:
    # At full speed the appending thread is busy the whole window while the sampling thread
    # sleeps: the figure is the appending thread's only if the right thread is sampled.
    args = build_parser().parse_args(["bench", "sustained", "--warmup", "0.1", "--seconds", "0.6"])
    _, window = _drive(_InstantWriter(), args, None, [os.getpid()])
    first, last = window[0], window[-1]
    assert last.appending_cpu - first.appending_cpu >= 0.3 * (last.at - first.at)
