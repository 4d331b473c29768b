"""stream/logs.py: structlog comes in without rich, unless the process chose otherwise, and our
console lines still carry a failure's traceback."""

from __future__ import annotations

import subprocess
import sys


def run(code: str) -> subprocess.CompletedProcess[str]:
    # A fresh interpreter: what a process has imported before `stream` decides.
    return subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True
    )


def test_the_client_imports_structlog_without_rich() -> None:
    run(
        "import sys, stream.client, structlog.dev\n"
        "loaded = [m for m in ('rich', 'pygments') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "assert structlog.dev.rich is None\n"
        "import rich.console\n"  # hidden only while structlog was imported
    )


def test_a_process_that_imported_structlog_first_keeps_its_rich() -> None:
    run("import structlog, stream.client, structlog.dev\nassert structlog.dev.rich is not None\n")


def test_console_lines_show_the_traceback() -> None:
    done = run(
        "import structlog\n"
        "from stream.logs import configure_logging\n"
        "configure_logging(json=False)\n"
        "try:\n"
        "    1 / 0\n"
        "except ZeroDivisionError:\n"
        "    structlog.get_logger('t').exception('failed')\n"
    )
    assert "failed" in done.stderr
    assert "Traceback (most recent call last)" in done.stderr
    assert "ZeroDivisionError: division by zero" in done.stderr
