"""`streamctl append` from stdin: bounded memory however long the input, and an interrupted
append says how many entries got in and the last id."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from stream.client import StreamClient
from stream.sandbox.cluster import SandboxCluster
from tests.integration.cli_support import streamctl

pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]


def test_append_from_stdin_acknowledges_every_line_in_order(cluster: SandboxCluster) -> None:
    lines = [f"line-{i}" for i in range(20_000)]  # more than the appends kept in flight
    assert streamctl(cluster.metadata, "create", "piped").returncode == 0
    appended = streamctl(cluster.metadata, "append", "piped", stdin="\n".join(lines) + "\n")
    assert appended.returncode == 0, appended.stderr
    assert "appended 20000 entries acknowledged: 0..19999" in appended.stderr
    with StreamClient.connect(cluster.metadata) as client:
        read = [e.payload.decode() for e in client.open_reader("piped").read(0, 19_999)]
    assert read == lines


def test_an_interrupted_append_says_what_got_in(cluster: SandboxCluster) -> None:
    assert streamctl(cluster.metadata, "create", "cut").returncode == 0
    # `env --default-signal=INT`: Ctrl-C's default action even when this runs in the background
    # of a script, whose children inherit SIGINT ignored (Python then installs no
    # KeyboardInterrupt handler). Not a `preexec_fn`: that forks this multi-threaded process
    # and runs gRPC's fork handlers, whose poller thread then lost its fds and the child
    # sometimes died before it started streamctl.
    append = subprocess.Popen(
        [
            *("env", "--default-signal=INT"),
            *(sys.executable, "-m", "stream.cli.main", "--metadata", cluster.metadata),
            *("append", "cut"),
        ],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert append.stdin is not None
    append.stdin.write("".join(f"kept-{i}\n" for i in range(100)))
    append.stdin.flush()
    with StreamClient.connect(cluster.metadata) as client:
        deadline = time.monotonic() + 30
        while (lac := client.stream_info("cut").lac) < 99:  # acknowledged, stdin still open
            if time.monotonic() > deadline:
                append.kill()
                _, err = append.communicate()
                pytest.fail(f"LAC {lac} after 30 s, streamctl exited {append.returncode}: {err}")
            time.sleep(0.05)
    append.send_signal(signal.SIGINT)
    _, err = append.communicate(timeout=30)
    assert append.returncode != 0
    assert "stopped: 100 entries acknowledged: 0..99 (last id 99)" in err, err
