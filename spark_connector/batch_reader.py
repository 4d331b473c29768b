"""`spark.read.format("streamkeeper")`: reads `startingOffsets..endingOffsets` once."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from spark_connector.catalog import StreamCatalog
from spark_connector.clients import client_for
from spark_connector.errors import ConnectorOptionError
from spark_connector.options import SourceOptions
from spark_connector.partition_reader import read_range
from spark_connector.ranges import StreamRange


class BatchReader(DataSourceReader):
    """Resolves the positions when Spark plans the read (on the driver side) and reads the
    partitions in executors."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        catalog = StreamCatalog(
            client_for(options.metadata, options.tls, options.metadata_auth_file), options
        )
        bounds = catalog.all_bounds(missing_ok=False)
        start = catalog.resolve_start(bounds, "earliest")
        end = catalog.resolve(options.ending, "endingOffsets", bounds, "latest")
        for option, offsets, word in (
            ("startingOffsets", start, "from"),
            ("endingOffsets", end, "up to"),
        ):
            for name, entry_id in offsets.items():
                if entry_id > bounds[name].next_entry_id:
                    raise ConnectorOptionError(
                        f"option {option!r} asks for stream {name!r} {word} entry {entry_id}, "
                        f"beyond its last committed entry {bounds[name].next_entry_id - 1}",
                        option=option,
                        stream=name,
                    )
        for name, entry_id in end.items():
            if entry_id < start[name]:
                raise ConnectorOptionError(
                    f"option 'endingOffsets' ({entry_id}) is before 'startingOffsets' "
                    f"({start[name]}) for stream {name!r}",
                    option="endingOffsets",
                    stream=name,
                )
        self._partitions = catalog.plan(start, end, bounds)

    def partitions(self) -> Sequence[InputPartition]:
        return self._partitions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, StreamRange)
        return read_range(partition)
