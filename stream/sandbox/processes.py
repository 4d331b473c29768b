"""The child processes of the sandbox (bookies, retention services): stopping them, and
reading their CPU time (for the benchmarks)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

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
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
