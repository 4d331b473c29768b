"""Stopping the child processes of the sandbox (bookies, retention services)."""

from __future__ import annotations

import signal
import subprocess


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
