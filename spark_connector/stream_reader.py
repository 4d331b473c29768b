"""`spark.readStream.format("streamkeeper")`: offsets are the next entry id per stream; a
micro-batch reads committed entries only (the end offsets never pass LAC + 1), so a replayed
batch reads the same rows.

PySpark 4.2 added read limits to Python data sources (`latestOffset(start, limit)`,
`getDefaultReadLimit`, `Trigger.AvailableNow`): there `admission_control.StreamReader` lets
Spark drive `maxEntriesPerTrigger` and `maxBytesPerTrigger`. PySpark 4.0 and 4.1 call
`latestOffset()` without arguments: `LegacyStreamReader` applies the limits itself from the
end of the batch it planned last."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from spark_connector.entry_sizes import EntrySizes
from spark_connector.ranges import Offsets, StreamRange, limit_offsets, ordered
from stream.logs import get_logger

if TYPE_CHECKING:
    import pyarrow as pa

    from spark_connector.catalog import StreamBounds, StreamCatalog
    from spark_connector.options import SourceOptions

log = get_logger(__name__)


def read_limits_supported() -> bool:
    """Returns whether this PySpark has the data source read limits (4.2 and newer)."""
    return importlib.util.find_spec("pyspark.sql.streaming.datasource") is not None


def new_stream_reader(options: SourceOptions) -> DataSourceStreamReader:
    """Returns the stream reader for this PySpark: with read limits where it has them."""
    if read_limits_supported():
        from spark_connector.admission_control import StreamReader

        return StreamReader(options)
    return LegacyStreamReader(options)


class StreamPlanner(DataSourceStreamReader):
    """What both readers share: offsets and partitions planned on the driver; `read()` works
    from the partition alone."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._target: Offsets | None = None  # the availableNow end, once prepared
        self._initial: Offsets | None = None  # initialOffset's answer, once read
        self._bounds: dict[str, StreamBounds] = {}
        # The bounds `prepareForTriggerAvailableNow` read, kept for the initial offsets and
        # the first batch's end, which Spark asks for right after (see `_latest`).
        self._prepared: dict[str, StreamBounds] | None = None
        self._sampled_entry_bytes: dict[str, float] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Executors get a pickled copy for read(); the driver-side state stays behind.
        return {"_options": self._options}

    def _catalog(self) -> StreamCatalog:
        # Imported here: Spark's planning process makes a reader but never plans with it.
        from spark_connector.catalog import StreamCatalog
        from spark_connector.clients import client_for

        options = self._options
        client = client_for(options.metadata, options.tls, options.metadata_auth_file)
        return StreamCatalog(client, options)

    def initialOffset(self) -> Offsets:
        # Spark asks more than once as a new query starts (twice before its first batch): one
        # answer, read once, as Kafka's source keeps its initial offsets. A second read would
        # cost a round of metadata and LAC reads and could name a later "latest" start.
        if self._initial is None:
            catalog = self._catalog()
            prepared = self._prepared
            if prepared is not None and all(n in prepared for n in self._options.streams):
                self._bounds = prepared
            else:  # raises for a stream of `streams` that does not exist
                self._bounds = catalog.all_bounds(missing_ok=False)
            self._initial = catalog.resolve_start(self._bounds, "latest")
        return dict(self._initial)

    def _latest(self) -> Offsets:
        prepared, self._prepared = self._prepared, None
        # An availableNow query's first batch ends at its target whatever the streams hold
        # by then, so the bounds read to set the target a moment ago serve it: as if Spark
        # had asked then. Another read would add a round of metadata and LAC reads per
        # stream to the query's start.
        self._bounds = (
            prepared if prepared is not None else self._catalog().all_bounds(missing_ok=True)
        )
        return {name: b.next_entry_id for name, b in self._bounds.items()}

    def _next_end(self, start: Offsets, max_entries: int | None, max_bytes: int | None) -> Offsets:
        """Returns the next batch's end offsets from `start`: everything committed (up to
        the availableNow target), or as much of it as the limits allow (None: no limit)."""
        target = self._target
        if target is not None and all(start.get(n, -1) >= end for n, end in target.items()):
            # An availableNow query that has read up to its target ends here whatever the
            # streams hold now (Spark asks once more before it stops): no cluster reads.
            return ordered(start)
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
        if max_entries is None and max_bytes is None:
            return ordered(latest)
        sizes = None if max_bytes is None else self._entry_sizes(base, latest)
        return limit_offsets(base, latest, max_entries, max_bytes, sizes)

    def _entry_sizes(self, base: Offsets, latest: Offsets) -> dict[str, EntrySizes]:
        """Returns each stream's entry sizes: its fragments' recorded bytes, else a sample of
        its entries (read once per stream and reader)."""
        sizes: dict[str, EntrySizes] = {}
        for name in latest:
            bounds = self._bounds.get(name)
            known = bounds.fragment_bytes if bounds is not None else ()
            if not known and name not in self._sampled_entry_bytes and latest[name] > base[name]:
                sampled = self._catalog().sampled_entry_bytes(name, base[name], latest[name] - 1)
                if sampled is not None:
                    self._sampled_entry_bytes[name] = sampled
            sizes[name] = EntrySizes.of(known, self._sampled_entry_bytes.get(name))
        return sizes

    def reportLatestOffset(self) -> Offsets | None:
        return ordered({n: b.next_entry_id for n, b in self._bounds.items()}) or None

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        return self._catalog().plan(start, end, self._bounds)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from spark_connector.partition_reader import read_range

        assert isinstance(partition, StreamRange)
        return read_range(partition)

    def commit(self, end: Offsets) -> None:
        # Arrives while the next batch is planned; nothing may depend on it being current.
        log.debug("spark.committed", end=end)


class LegacyStreamReader(StreamPlanner):
    """The reader of PySpark 4.0 and 4.1, whose `latestOffset()` is not told where the batch
    starts: it starts where the last batch this reader planned (or was asked to replay)
    ended. After a restart from a checkpoint whose last batch was committed, Spark names no
    start before the first new batch, so that batch reads everything committed (logged)."""

    def __init__(self, options: SourceOptions) -> None:
        super().__init__(options)
        self._position: Offsets | None = None

    def initialOffset(self) -> Offsets:
        self._position = super().initialOffset()
        return self._position

    def latestOffset(self) -> Offsets:  # type: ignore[override]
        options = self._options
        if self._position is None:
            if options.max_entries_per_trigger or options.max_bytes_per_trigger:
                log.warning("spark.batch_unbounded", reason="start unknown after a restart")
            end = self._next_end({}, None, None)
        else:
            end = self._next_end(
                self._position, options.max_entries_per_trigger, options.max_bytes_per_trigger
            )
        self._position = end
        return end

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        self._position = dict(end)
        return super().partitions(start, end)
