"""Fixtures of the Spark connector tests: one real cluster (ZooKeeper + 3 bookie processes)
and one local[2] SparkSession for the whole package; each test uses streams of its own.

Package-scoped, not session-scoped: they stop after the package's last test instead of keeping
three bookies, a Spark session and live ZooKeeper clients running through every later test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from stream.client import StreamClient
from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.zookeeper import ZooKeeperServer
from tests.integration.conftest import running_cluster
from tests.spark.session import local_session

# Every test module here starts with pytest.importorskip("pyspark", ...) and ("pyarrow"): without
# the spark extra (pip install '.[spark]') they are skipped with that reason.


@pytest.fixture(scope="package")
def spark_cluster(
    zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandboxCluster]:
    """Three bookies on the session's ZooKeeper, under a root of their own."""
    with running_cluster(zookeeper, tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="package")
def client(spark_cluster: SandboxCluster) -> Iterator[StreamClient]:
    with StreamClient.connect(spark_cluster.metadata) as c:
        yield c


@pytest.fixture(scope="package")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local[2] SparkSession (UI off, loopback only) with the connector registered."""
    session = local_session("streamkeeper-tests", tmp_path_factory.mktemp("spark-local"))
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def stream_name() -> str:
    return f"s-{uuid.uuid4().hex[:10]}"


def payload(stream: str, i: int, size: int = 0) -> bytes:
    """Returns a distinct, checkable payload for entry number `i` of `stream`, padded to
    `size` bytes."""
    return f"{stream}:{i:08d}".encode().ljust(size, b".")


def append(
    client: StreamClient, stream: str, count: int, start: int = 0, size: int = 0, **create: Any
) -> None:
    """Creates `stream` (if needed) and appends payload(stream, start..start+count-1, size)."""
    client.create_stream(stream, **create)
    with client.open_writer(stream) as writer:
        futures = [
            writer.append_async(payload(stream, i, size)) for i in range(start, start + count)
        ]
        writer.flush()
        for f in futures:
            f.result()
