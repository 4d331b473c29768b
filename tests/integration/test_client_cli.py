"""`streamctl create/append/tail/info` against a real cluster (the commands' contract)."""

from __future__ import annotations

import json

import pytest

from stream.sandbox.cluster import SandboxCluster
from tests.integration.cli_support import streamctl

pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]


def test_create_append_tail_info(cluster: SandboxCluster) -> None:
    metadata = cluster.metadata
    created = streamctl(
        metadata, "create", "cli", "--ensemble", "3", "--write-quorum", "3", "--ack-quorum", "2"
    )
    assert created.returncode == 0, created.stderr
    bad = streamctl(metadata, "create", "nope", "--ensemble", "2", "--write-quorum", "3")
    assert bad.returncode == 2 and "error" in bad.stderr  # a usage error: nothing changed
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


def test_bench_append_and_tail_report_their_figures(cluster: SandboxCluster) -> None:
    # The benchmarks' contract, not their speed: each run prints a table and, with --json, one
    # JSON line of figures per run, with every entry appended accounted for.
    appended = streamctl(
        cluster.metadata, "bench", "append", "--existing", "--json", "--sizes", "100",
        "--writers", "1,2", "--quorums", "e3w2a2", "--seconds", "0.5", "--paced",
    )  # fmt: skip
    assert appended.returncode == 0, appended.stderr
    runs = [json.loads(line) for line in appended.stdout.splitlines() if line.startswith("{")]
    assert [(r["writers"], r["target_rate"] is None) for r in runs] == [
        (1, True),
        (2, True),
        (1, False),
    ]
    assert all(r["entries"] > 0 and r["p50_ms"] <= r["p99_ms"] for r in runs)
    assert "entries/s" in appended.stdout
    tailed = streamctl(
        cluster.metadata, "bench", "tail", "--existing", "--json",
        "--total-bytes", str(4 << 20), "--entry-size", "4096",
    )  # fmt: skip
    assert tailed.returncode == 0, tailed.stderr
    (figures,) = [json.loads(line) for line in tailed.stdout.splitlines() if line.startswith("{")]
    assert figures["entries"] == 1024
