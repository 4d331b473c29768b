"""`streamctl create/append/tail/info` against a real cluster (the commands' contract)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stream.sandbox.cluster import SandboxCluster

pytestmark = pytest.mark.integration


def streamctl(
    metadata: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stream.cli.main", "--metadata", metadata, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_create_append_tail_info(cluster: SandboxCluster) -> None:
    metadata = cluster.metadata
    created = streamctl(
        metadata, "create", "cli", "--ensemble", "3", "--write-quorum", "3", "--ack-quorum", "2"
    )
    assert created.returncode == 0, created.stderr
    bad = streamctl(metadata, "create", "nope", "--ensemble", "2", "--write-quorum", "3")
    assert bad.returncode == 1 and "error" in bad.stderr
    appended = streamctl(metadata, "append", "cli", stdin="one\ntwo\nthree\n")
    assert appended.returncode == 0, appended.stderr
    appended = streamctl(metadata, "append", "cli", "--message", "four")
    assert appended.returncode == 0, appended.stderr
    tailed = streamctl(metadata, "tail", "cli", "--from", "earliest", "--timeout", "1")
    assert tailed.returncode == 0, tailed.stderr
    # The second writer's takeover left a no-op at 3: tail never prints it.
    assert tailed.stdout.splitlines() == ["one", "two", "three", "four"]
    with_ids = streamctl(metadata, "tail", "cli", "--from", "4", "--timeout", "0.5", "--show-ids")
    assert with_ids.stdout.split("\t")[0] == "4"
    info = streamctl(metadata, "info", "cli")
    assert info.returncode == 0, info.stderr
    for expected in ("term", "OPEN", "LAC", "first entry", "fragments", "bookie-"):
        assert expected in info.stdout
