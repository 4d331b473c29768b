"""The `streamkeeper` Python data source: batch and streaming reads, streaming writes."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
)
from pyspark.sql.types import StructType

from spark_connector.schema import source_schema

NAME = "streamkeeper"

# The readers and the writer are imported where they are made, not above: Spark loads this
# module in a fresh Python process for each query's analysis (`schema()`) and planning, where
# importing the client stack would cost about 0.3 s of every query's start.


class StreamkeeperDataSource(DataSource):
    """`format("streamkeeper")`; options as in docs/design.md §8 (see `spark_connector.options`)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return source_schema(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        from spark_connector.batch_reader import BatchReader
        from spark_connector.options import parse_source_options

        return BatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from spark_connector.options import parse_source_options
        from spark_connector.stream_reader import StreamReader

        return StreamReader(parse_source_options(self.options, streaming=True))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from spark_connector.options import parse_sink_options
        from spark_connector.stream_writer import StreamWriter

        return StreamWriter(parse_sink_options(self.options), schema)
