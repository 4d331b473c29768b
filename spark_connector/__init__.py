"""The Spark Structured Streaming connector of Streamkeeper (docs/design.md §8): a PySpark Python
data source named `streamkeeper`. Call `register(spark)` once per session, then
`spark.readStream.format("streamkeeper").option("metadata", ...).option("streams", ...)`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_connector.source import NAME, StreamkeeperDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Registers the `streamkeeper` data source with `spark`."""
    spark.dataSource.register(StreamkeeperDataSource)


__all__ = ["NAME", "StreamkeeperDataSource", "register"]
