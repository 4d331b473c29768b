"""Query drivers in processes of their own, for the kill -9 tests: starting them (optionally
held until released), reading their checkpoint's progress, and killing their process trees."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.spark.session import ROOT


def batch_ids(out: Path, log: str) -> list[int]:
    """Returns the batch ids in the checkpoint's `log` (offsets: planned, commits: done)."""
    folder = out / "checkpoint" / log
    if not folder.exists():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def committed_offsets(out: Path) -> dict[str, int]:
    """Returns the end offsets of the query's last committed batch ({} before the first): the
    checkpoint's commits/N says batch N is done, offsets/N ("v1", metadata, then our source's
    offset JSON) where it ended."""
    done = batch_ids(out, "commits")
    if not done:
        return {}
    lines = (out / "checkpoint" / "offsets" / str(done[-1])).read_text().splitlines()
    offsets: dict[str, int] = json.loads(lines[-1])
    return offsets


def in_flight(out: Path) -> bool:
    """Returns whether a batch was committed and the next one planned but not committed."""
    done, planned = batch_ids(out, "commits"), batch_ids(out, "offsets")
    return bool(done) and bool(planned) and planned[-1] > done[-1]


def process_tree(pid: int) -> list[int]:
    """Returns `pid` and all its descendants alive now (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_9(process: subprocess.Popen[bytes]) -> None:
    """SIGKILLs the driver's whole process tree at once, like a crash of its machine: its
    process group (the driver Python and the JVM), and the groups of its descendants (PySpark's
    worker daemon puts itself and its workers in a group of their own)."""
    if process.poll() is not None:
        return  # gone already (and its pid may be reused)
    tree = process_tree(process.pid)
    groups = {process.pid}
    for pid in tree:
        try:
            if os.getpgid(pid) in tree:
                groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in tree), [p for p in tree if alive(p)]


def start_driver(
    module: str, out: Path, run: int, *args: str, held: bool = False
) -> subprocess.Popen[bytes]:
    """Starts `python -m module --out OUT *args` in a new session (its own process group),
    logging to out/driver-RUN.log. `held`: the driver starts Spark and then waits for
    `release()` before it starts its query, so that a test can start the next run's JVM while
    the current run works and restart it at once after a kill."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    )
    command = [sys.executable, "-m", module, "--out", str(out), *args]
    with open(out / f"driver-{run}.log", "wb") as log_file:
        return subprocess.Popen(
            [*command, "--held"] if held else command,
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE if held else subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def release(driver: subprocess.Popen[bytes]) -> None:
    """Lets a driver started `held` start its query (a line on its stdin)."""
    assert driver.stdin is not None, "the driver was not started held"
    driver.stdin.write(b"go\n")
    driver.stdin.close()


def wait_for(
    out: Path,
    stream: str,
    driver: subprocess.Popen[bytes],
    run: int,
    reached: Callable[[int], bool],
    deadline: float,
) -> int:
    """Returns the stream's committed offset once `reached(offset)` holds; fails when the
    driver exits or the deadline passes (with the driver's log tail)."""
    while True:
        offset = committed_offsets(out).get(stream, 0)
        if reached(offset):
            return offset
        if driver.poll() is not None or time.monotonic() > deadline:
            log_tail = (out / f"driver-{run}.log").read_text(errors="replace")[-3000:]
            raise AssertionError(
                f"driver run {run} (exit {driver.poll()}) at offset {offset}:\n{log_tail}"
            )
        time.sleep(0.2)
