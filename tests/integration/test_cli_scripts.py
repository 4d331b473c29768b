"""`streamctl` for scripts against a real cluster: JSON from the bookies, exit codes, and the
tail and trim behaviours a script can rely on (issue 17)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.zookeeper import ZooKeeperServer
from tests.integration.cli_support import streamctl
from tests.integration.conftest import running_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def shared(
    zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandboxCluster]:
    """One cluster for the module: every test works on streams of its own."""
    with running_cluster(zookeeper, Path(tmp_path_factory.mktemp("cli"))) as cluster:
        yield cluster


def _stream_with(metadata: str, name: str, *payloads: str) -> None:
    created = streamctl(metadata, "create", name)
    assert created.returncode == 0, created.stderr
    appended = streamctl(metadata, "append", name, stdin="".join(f"{p}\n" for p in payloads))
    assert appended.returncode == 0, appended.stderr


def test_tail_max_entries_stops_without_a_timeout(shared: SandboxCluster) -> None:
    _stream_with(shared.metadata, "few", "a", "b", "c", "d")
    tailed = streamctl(shared.metadata, "tail", "few", "--from", "earliest", "--max-entries", "2",
                       timeout_s=60)  # fmt: skip
    assert tailed.returncode == 0, tailed.stderr
    assert tailed.stdout.splitlines() == ["a", "b"]


def test_tail_ends_at_the_end_of_a_sealed_stream(shared: SandboxCluster) -> None:
    metadata = shared.metadata
    _stream_with(metadata, "done", "x", "y")
    # A tail that is running when the stream is sealed ends too.
    running = subprocess.Popen(
        [sys.executable, "-m", "stream.cli.main", "--metadata", metadata, "tail", "done",
         "--from", "earliest"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert running.stdout is not None
        # Running: it printed what the stream holds and waits for more.
        assert running.stdout.readline() == "x\n"
        assert running.stdout.readline() == "y\n"
        assert running.poll() is None
        sealed = streamctl(metadata, "seal", "done")
        assert sealed.returncode == 0, sealed.stderr
        out, err = running.communicate(timeout=60)
    finally:
        running.kill()
        running.wait()
    assert running.returncode == 0, err
    assert out == ""  # nothing after the last entry: the sealed end closed the tail
    tailed = streamctl(metadata, "tail", "done", "--from", "earliest", timeout_s=60)
    assert tailed.returncode == 0, tailed.stderr
    assert tailed.stdout.splitlines() == ["x", "y"]
    latest = streamctl(metadata, "tail", "done", timeout_s=60)
    assert (latest.returncode, latest.stdout) == (0, "")
    # Sealed: appending is a conflict (exit code 5).
    refused = streamctl(metadata, "append", "done", "-m", "z")
    assert refused.returncode == 5, refused.stderr


def test_trim_beyond_the_lac_says_nothing_was_trimmed(shared: SandboxCluster) -> None:
    _stream_with(shared.metadata, "short", "1", "2", "3")
    trimmed = streamctl(shared.metadata, "trim", "short", "--before", "1000")
    assert trimmed.returncode == 0, trimmed.stderr
    assert "nothing was trimmed" in trimmed.stdout
    assert streamctl(shared.metadata, "trim", "missing", "--before", "1").returncode == 3


def test_bookies_and_bookie_info_as_json(shared: SandboxCluster) -> None:
    listed = streamctl(shared.metadata, "bookies", "--output", "json")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["state"] for r in rows] == ["available"] * 3
    first = shared.bookies[0]
    assert rows[0]["bookie_id"] == first.bookie_id and rows[0]["address"] == first.address
    assert rows[0]["free_bytes"] > 0 and rows[0]["journal_write_data"] is True
    info = streamctl(shared.metadata, "bookie", "info", "--address", first.address,
                     "--output", "json")  # fmt: skip
    assert info.returncode == 0, info.stderr
    fields = json.loads(info.stdout)
    assert fields["bookie_id"] == first.bookie_id
    assert isinstance(fields["free_bytes"], int) and fields["free_bytes"] > 0
    table = streamctl(shared.metadata, "bookie", "info", "--address", first.address)
    assert "iB" in table.stdout  # free and total bytes in human units
