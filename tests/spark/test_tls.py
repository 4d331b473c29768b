"""The connector over TLS (options tlsCaFile, tlsCertFile, tlsKeyFile): a streaming write with
a writer certificate and a batch read with a reader certificate, on bookies that require
mutual TLS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from stream.client import StreamClient, TLSConfig
from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.zookeeper import ZooKeeperServer
from stream.security.roles import Role
from tests.integration.bookie_support import wait_until
from tests.integration.conftest import running_cluster

pytestmark = [pytest.mark.spark, pytest.mark.integration]


@pytest.fixture(scope="module")
def secure(
    zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandboxCluster]:
    with running_cluster(
        zookeeper, tmp_path_factory.mktemp("spark-secure"), secure=True
    ) as cluster:
        yield cluster


def tls_options(files: TLSConfig) -> dict[str, str]:
    return {
        "tlsCaFile": files.ca_file,
        "tlsCertFile": str(files.cert_file),
        "tlsKeyFile": str(files.key_file),
    }


def test_the_connector_writes_and_reads_over_tls(
    spark: Any, secure: SandboxCluster, stream_name: str, tmp_path: Path
) -> None:
    assert secure.tls is not None
    writer = secure.tls.client(Role.WRITER)
    with StreamClient.connect(
        secure.metadata, tls=writer, metadata_auth_file=secure.metadata_auth_file
    ) as client:
        client.create_stream(stream_name)
        query = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", "50")
            .load()
            .selectExpr("CAST(value AS STRING) AS payload")
            .writeStream.format("streamkeeper")
            .option("metadata", secure.metadata)
            .option("stream", stream_name)
            .option("metadataAuthFile", str(secure.metadata_auth_file))
            .options(**tls_options(writer))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        try:
            reader = client.open_reader(stream_name)
            lac = wait_until(
                lambda: (n := reader.last_add_confirmed()) >= 20 and n,
                timeout_s=60,
                what="entries written by Spark",
            )
        finally:
            query.stop()
    rows = (
        spark.read.format("streamkeeper")
        .option("metadata", secure.metadata)
        .option("streams", stream_name)
        .option("endingOffsets", f'{{"{stream_name}": {lac + 1}}}')
        .option("metadataAuthFile", str(secure.metadata_auth_file))
        .options(**tls_options(secure.tls.client(Role.READER)))
        .load()
        .collect()
    )
    values = sorted(int(bytes(r.payload)) for r in rows)
    assert len(values) == lac + 1
    assert values == list(range(len(values)))
