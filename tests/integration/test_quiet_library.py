"""A library is quiet: a program using `stream.client` prints only its own output, and sees
our logs through the standard `logging` module when it asks for them; `streamctl --log-json`
renders every line, kazoo's too, as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stream.sandbox.cluster import SandboxCluster
from tests.integration.cli_support import streamctl

# Its tests kill no bookie and use streams of their own: one cluster for the module.
pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]

_PROGRAM = r"""
import logging
import sys

from stream.client import StreamClient

if sys.argv[2] == "with-logging":
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
client = StreamClient.connect(sys.argv[1])
client.create_stream("quiet-" + sys.argv[2])
with client.open_writer("quiet-" + sys.argv[2]) as writer:
    for word in ("one", "two", "three"):
        writer.append(word.encode())
for entry in client.open_reader("quiet-" + sys.argv[2]).read(0, 2):
    print(entry.entry_id, entry.payload.decode())
client.close()
print("done")
"""


def _run_program(metadata: str, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _PROGRAM, metadata, mode],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_program_using_the_client_prints_exactly_its_own_output(
    cluster: SandboxCluster,
) -> None:
    ran = _run_program(cluster.metadata, "plain")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "0 one\n1 two\n2 three\ndone\n"


def test_a_program_that_configures_logging_gets_the_client_events_there(
    cluster: SandboxCluster,
) -> None:
    ran = _run_program(cluster.metadata, "with-logging")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "0 one\n1 two\n2 three\ndone\n"
    assert "INFO:stream.metadata.connection:" in ran.stderr
    assert "'event': 'metadata.connected'" in ran.stderr


def test_streamctl_log_json_renders_every_line_as_json_kazoo_included(
    cluster: SandboxCluster,
) -> None:
    created = streamctl(cluster.metadata, "--log-json", "--log-level", "info", "create", "json")
    assert created.returncode == 0, created.stderr
    lines = [json.loads(line) for line in created.stderr.splitlines() if line.strip()]
    assert "metadata.connected" in {line["event"] for line in lines}
    assert all({"event", "level", "timestamp"} <= line.keys() for line in lines)
    # A one-shot command keeps kazoo's lines off stderr (its "Connection dropped" stack when
    # ZooKeeper is gone); a service renders them like its own: the bookies' logs.
    logged = [
        json.loads(line)
        for bookie in cluster.bookies
        for line in bookie.log_path.read_text().splitlines()
        if line.startswith("{")
    ]
    assert any(line.get("logger", "").startswith("kazoo") for line in logged)
