"""Runs the real `streamctl` (a separate process) against a test cluster."""

from __future__ import annotations

import os
import subprocess
import sys


def streamctl(
    metadata: str,
    *args: str,
    stdin: str | None = None,
    timeout_s: float = 120,
    columns: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """Returns the finished `streamctl --metadata METADATA ARGS...` (text output captured);
    `columns` widens the terminal its tables are drawn for."""
    env = None if columns is None else {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "stream.cli.main", "--metadata", metadata, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )
