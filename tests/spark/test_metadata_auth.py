"""The connector on a cluster whose metadata has ACLs: with `metadataAuthFile` a streaming query
reads one stream and writes another (driver and executors authenticate), without it the read
is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from stream.client import StreamClient
from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.zookeeper import ZooKeeperServer
from tests.acl_support import fresh_root, write_auth_file
from tests.spark.conftest import append, payload

pytestmark = [pytest.mark.spark, pytest.mark.integration]


@pytest.fixture(scope="module")
def secured(
    zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandboxCluster]:
    """Three bookies whose every znode is closed to anyone without the auth file."""
    path = tmp_path_factory.mktemp("spark-acl")
    with SandboxCluster(
        path / "cluster",
        root=fresh_root(),
        zookeeper=zookeeper,
        metadata_auth_file=write_auth_file(path),
        bookie_settings={"autorecovery": False},
    ) as cluster:
        yield cluster


def test_streaming_read_and_write_with_metadata_auth_file(
    spark: Any, secured: SandboxCluster, stream_name: str, tmp_path: Path
) -> None:
    auth = str(secured.metadata_auth_file)
    source, target = stream_name, stream_name + "-copy"
    with StreamClient.connect(secured.metadata, metadata_auth_file=auth) as client:
        append(client, source, 300)
        client.create_stream(target)
        query = (
            spark.readStream.format("streamkeeper")
            .option("metadata", secured.metadata)
            .option("metadataAuthFile", auth)
            .option("streams", source)
            .option("startingOffsets", "earliest")
            .option("entriesPerPartition", "64")
            .load()
            .select("payload")
            .writeStream.format("streamkeeper")
            .option("metadata", secured.metadata)
            .option("metadataAuthFile", auth)
            .option("stream", target)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None
        reader = client.open_reader(target)
        copied = [e.payload for e in reader.read(0, reader.last_add_confirmed())]
        assert copied == [payload(source, i) for i in range(300)]


def test_batch_read_without_metadata_auth_file_is_refused(
    spark: Any, secured: SandboxCluster
) -> None:
    frame = spark.read.format("streamkeeper").option("metadata", secured.metadata)
    with pytest.raises(Exception, match="PermissionDenied|metadata auth file"):
        frame.option("streams", "anything").load().collect()
