"""`streamctl sandbox` on real processes: the demo runs on four bookies and leaves no
temporary directory behind; a running sandbox reports at once a process that died, restarts
nothing, and stops when ZooKeeper is gone."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _sandbox(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "stream.cli.main", "sandbox", "--retention-interval", "off", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _pids_under(data_dir: Path) -> dict[str, int]:
    """The sandbox's child processes (by what their command line names) and their pids."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(data_dir) in cmdline:
            match = re.search(r"(bookie-\d+)/bookie\.toml|(zoo)\.cfg", cmdline)
            if match:
                found[match.group(1) or "ZooKeeper"] = int(entry.name)
    return found


def _wait(predicate: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_the_demo_runs_on_four_bookies_and_removes_its_directory() -> None:
    done = _sandbox("--demo")
    out, err = done.communicate(timeout=240)
    assert done.returncode == 0, err[-3000:]
    match = re.search(r"data and logs in (\S+) \(removed when it stops\)", err)
    assert match, err[-3000:]
    assert not Path(match.group(1)).exists()
    assert re.fullmatch(r"127\.0\.0\.1:\d+/streamkeeper\n", out.splitlines(keepends=True)[0])


def test_a_dead_bookie_is_reported_and_a_dead_zookeeper_stops_the_sandbox(
    tmp_path: Path,
) -> None:
    sandbox = _sandbox("--data-dir", str(tmp_path), "--bookies", "3")
    seen: list[str] = []
    try:
        assert sandbox.stdout is not None and sandbox.stderr is not None
        reader = threading.Thread(target=lambda: seen.extend(sandbox.stderr), daemon=True)
        reader.start()
        assert sandbox.stdout.readline().endswith("/streamkeeper\n")
        pids = _pids_under(tmp_path)
        assert set(pids) == {"ZooKeeper", "bookie-1", "bookie-2", "bookie-3"}, pids

        os.kill(pids["bookie-2"], signal.SIGKILL)
        assert _wait(lambda: "bookie-2 exited" in "".join(seen), 10), "".join(seen)
        assert "not restarted" in "".join(seen)
        assert sandbox.poll() is None  # a bookie gone: the sandbox goes on
        assert "bookie-2" not in _pids_under(tmp_path)  # nothing restarted it

        os.kill(pids["ZooKeeper"], signal.SIGKILL)
        assert sandbox.wait(timeout=30) == 1
        reader.join(timeout=10)
        assert "ZooKeeper exited" in "".join(seen), "".join(seen)
        assert _wait(lambda: not _pids_under(tmp_path), 30), _pids_under(tmp_path)
    finally:
        if sandbox.poll() is None:
            os.killpg(sandbox.pid, signal.SIGTERM)
            sandbox.wait(timeout=60)
        for pid in _pids_under(tmp_path).values():
            os.kill(pid, signal.SIGKILL)


def test_the_demo_runs_on_a_three_server_zookeeper_ensemble() -> None:
    done = _sandbox("--demo", "--zookeepers", "3", "--bookies", "3")
    out, err = done.communicate(timeout=240)
    assert done.returncode == 0, err[-3000:]
    hosts = out.splitlines()[0].split("/", 1)[0].split(",")
    assert len(hosts) == 3 and len({h.split(":")[1] for h in hosts}) == 3, out


def test_an_ensemble_takes_no_fixed_port() -> None:
    done = _sandbox("--zookeepers", "3", "--zk-port", "2181")
    _, err = done.communicate(timeout=60)
    assert done.returncode == 2, err[-3000:]
    assert "an ensemble takes no --zk-port" in err
