"""The child processes of the sandbox (bookies, retention services): stopping them, and
reading their CPU time, disk writes and memory (for the benchmarks)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from stream.errors import StreamError

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def terminate(process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Sends SIGTERM (a clean shutdown) and waits; SIGKILL after `timeout_s`. Returns whether
    the process had to be killed."""
    if process.poll() is not None:
        return False
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return True
    return False


def cpu_seconds(pid: int) -> float:
    """Returns the user + system CPU seconds process `pid` used so far (from /proc)."""
    return _stat_cpu_seconds(f"/proc/{pid}/stat")


def thread_cpu_seconds(pid: int, tid: int) -> float:
    """Returns the user + system CPU seconds thread `tid` (its native id) of process `pid`
    used so far (from /proc)."""
    return _stat_cpu_seconds(f"/proc/{pid}/task/{tid}/stat")


def _stat_cpu_seconds(path: str) -> float:
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _proc_field(path: str, name: str) -> str:
    """Returns the value after `name:` in a /proc file of `key: value` lines."""
    for line in Path(path).read_text().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise StreamError(f"no {name} in {path}")


def write_bytes(pid: int) -> int:
    """Returns the bytes process `pid` caused to be written to storage so far (/proc io)."""
    return int(_proc_field(f"/proc/{pid}/io", "write_bytes"))


def sleeps(pid: int) -> int:
    """Returns how many times the threads of process `pid` that are alive now went to sleep so
    far (their voluntary context switches: waits for I/O, a lock, a wake-up), each a wake-up
    to pay for later (docs/benchmarks.md); a thread that ended is no longer counted."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int(_proc_field(str(task / "status"), "voluntary_ctxt_switches"))
        except (OSError, StreamError):
            continue  # the thread ended meanwhile
    return total


def peak_rss_bytes(pid: int) -> int:
    """Returns the largest resident set process `pid` had so far (VmHWM)."""
    return int(_proc_field(f"/proc/{pid}/status", "VmHWM").split()[0]) * 1024


def resident_bytes(pid: int) -> tuple[int, int]:
    """Returns the resident set process `pid` has now (VmRSS) and its anonymous part (RssAnon:
    the heap, not the pages of mapped files such as an LMDB index, which the kernel can drop)."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.partition(":")[::2] for line in status.splitlines())
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["RssAnon"].split()[0]) * 1024
