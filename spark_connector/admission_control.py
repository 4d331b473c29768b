"""The stream reader of PySpark 4.2 and newer: Spark asks for the default read limit, hands
it back to `latestOffset(start, limit)` with the batch's start, and prepares
`Trigger.AvailableNow`, so the per-trigger limits follow Spark's own rules (Trigger.Once, for
one, reads everything, as with the Kafka source)."""

from __future__ import annotations

from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from spark_connector.ranges import Offsets
from spark_connector.stream_reader import StreamPlanner
from stream.logs import get_logger

log = get_logger(__name__)


class StreamReader(StreamPlanner, SupportsTriggerAvailableNow):
    """Spark's read limit names one bound (it has no composite limit for Python sources):
    `maxEntriesPerTrigger` as `ReadMaxRows` when set, else `maxBytesPerTrigger` as
    `ReadMaxBytes`; the other option, when both are set, applies alongside it."""

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._options.max_entries_per_trigger is not None:
            return ReadMaxRows(self._options.max_entries_per_trigger)
        if self._options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self._options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()
        self._prepared = self._bounds
        log.info("spark.available_now_target", target=self._target)

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        max_entries = self._options.max_entries_per_trigger
        max_bytes = self._options.max_bytes_per_trigger
        if isinstance(limit, ReadAllAvailable):
            max_entries = max_bytes = None
        elif isinstance(limit, ReadMaxRows):
            max_entries = limit.max_rows
        elif isinstance(limit, ReadMaxBytes):
            max_bytes = limit.max_bytes
        return self._next_end(start, max_entries, max_bytes)
