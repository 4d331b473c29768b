"""A reader's process imports no writer: each Spark query's tasks start fresh Python workers
that unpickle the connector's reader and connect a `StreamClient`, and the writer's modules
(its pipeline, recovery, seal, accept-loss) are loaded by the first writer only."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# What a reader never runs: the writer's side of the client, and the other processes' code.
_NOT_FOR_READERS = (
    "stream.client.writer",
    "stream.client.pipeline",
    "stream.client.recovery",
    "stream.client.seal",
    "stream.client.accept_loss",
    "stream.sim",
    "stream.bookie",
    "stream.sandbox",
    "stream.cli",
)


def _loaded_after(code: str) -> list[str]:
    """Returns the modules of `_NOT_FOR_READERS` a fresh interpreter has after running `code`."""
    probe = (
        f"{code}\nprefixes = {_NOT_FOR_READERS!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules for p in prefixes\n"
        "                        if m == p or m.startswith(p + '.'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys\n" + probe],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def test_the_client_and_its_reader_load_no_writer() -> None:
    assert _loaded_after("from stream.client import StreamClient, StreamReader") == []


def test_the_spark_connectors_executor_side_reader_loads_no_writer() -> None:
    pytest.importorskip("pyspark")
    code = (
        "import spark_connector.partition_reader, spark_connector.stream_reader, "
        "spark_connector.batch_reader\n"
        "from spark_connector.clients import client_for"
    )
    assert _loaded_after(code) == []
