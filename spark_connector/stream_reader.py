"""`spark.readStream.format("streamkeeper")`: offsets are the next entry id per stream; a
micro-batch reads committed entries only (the end offsets never pass LAC + 1), so a replayed
batch reads the same rows."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import structlog
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from spark_connector.ranges import Offsets, StreamRange, limit_offsets, ordered

if TYPE_CHECKING:
    import pyarrow as pa

    from spark_connector.catalog import StreamBounds, StreamCatalog
    from spark_connector.options import SourceOptions

log = structlog.get_logger(__name__)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver; `read()` works from the partition alone."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._target: Offsets | None = None  # the availableNow end, once prepared
        self._bounds: dict[str, StreamBounds] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Executors get a pickled copy for read(); the driver-side state stays behind.
        return {"_options": self._options, "_target": None, "_bounds": {}}

    def _catalog(self) -> StreamCatalog:
        # Imported here: Spark's planning process makes a reader but never plans with it.
        from spark_connector.catalog import StreamCatalog
        from spark_connector.clients import client_for

        options = self._options
        client = client_for(options.metadata, options.tls, options.metadata_auth_file)
        return StreamCatalog(client, options)

    def initialOffset(self) -> dict:
        catalog = self._catalog()
        self._bounds = catalog.all_bounds(missing_ok=False)
        return catalog.resolve(self._options.starting, "startingOffsets", self._bounds, "latest")

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._options.max_entries_per_trigger is not None:
            return ReadMaxRows(self._options.max_entries_per_trigger)
        return ReadAllAvailable()

    def _latest(self) -> Offsets:
        self._bounds = self._catalog().all_bounds(missing_ok=True)
        return {name: b.next_entry_id for name, b in self._bounds.items()}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()
        log.info("spark.available_now_target", target=self._target)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest = self._latest()
        if self._target is not None:
            latest = {n: min(v, self._target[n]) for n, v in latest.items() if n in self._target}
        # A stream new to the query starts at its first retained entry; a stream that went
        # away keeps its offset (offsets never move back).
        base = dict(start)
        for name in latest:
            if name not in base:
                base[name] = self._bounds[name].first_retained
        latest = {n: max(v, base[n]) for n, v in latest.items()}
        for name, entry_id in base.items():
            latest.setdefault(name, entry_id)
        if isinstance(limit, ReadMaxRows):
            return limit_offsets(base, latest, limit.max_rows)
        return ordered(latest)

    def reportLatestOffset(self) -> dict | None:
        return ordered({n: b.next_entry_id for n, b in self._bounds.items()}) or None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self._catalog().plan(start, end, self._bounds)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from spark_connector.partition_reader import read_range

        assert isinstance(partition, StreamRange)
        return read_range(partition)

    def commit(self, end: dict) -> None:
        # Arrives while the next batch is planned; nothing may depend on it being current.
        log.debug("spark.committed", end=end)
