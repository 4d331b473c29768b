"""The driver's view of the streams a query reads: which streams (a list or a pattern), and
for each its first retained entry, its next entry id (LAC + 1) and its fragment starts."""

from __future__ import annotations

from dataclasses import dataclass

from spark_connector.entry_sizes import SAMPLE_ENTRIES, whole_fragment_bytes
from spark_connector.errors import ConnectorOptionError, DataLossError
from spark_connector.options import EARLIEST, LATEST, Positions, SourceOptions
from spark_connector.ranges import Offsets, StreamRange, at_least, ordered, split_range
from stream.client import StreamClient
from stream.errors import EntryTrimmedError, StreamNotFoundError
from stream.logs import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class StreamBounds:
    """What one stream holds now: entries `first_retained..next_entry_id - 1`, its fragments'
    first entry ids, and `(first, last, bytes)` of those whose recorded bytes are whole."""

    name: str
    first_retained: int
    next_entry_id: int
    fragment_firsts: tuple[int, ...]
    fragment_bytes: tuple[tuple[int, int, int], ...] = ()
    stream_id: int | None = None


class StreamCatalog:
    """Looks streams up for a reader on the driver (one client, not pickled)."""

    def __init__(self, client: StreamClient, options: SourceOptions) -> None:
        self._client = client
        self._options = options

    def names(self) -> list[str]:
        """Returns the streams to read: the `streams` option, or every stream matching
        `streamPattern` now, sorted."""
        if self._options.streams:
            return sorted(self._options.streams)
        return [n for n in self._client.list_streams() if self._options.pattern_matches(n)]

    def bounds(self, name: str) -> StreamBounds:
        """Returns the stream's bounds; raises `StreamNotFoundError`."""
        info = self._client.stream_info(name, brief=True)
        return StreamBounds(
            name=name,
            first_retained=info.first_entry_id,
            next_entry_id=max(info.lac + 1, info.first_entry_id),
            fragment_firsts=tuple(f.first_entry_id for f in info.fragments),
            fragment_bytes=whole_fragment_bytes(
                [(f.first_entry_id, f.last_entry_id, f.bytes) for f in info.fragments],
                [first for _, first in info.term_history],
            ),
            stream_id=info.stream_id,
        )

    def sampled_entry_bytes(self, name: str, first: int, last: int) -> float | None:
        """Returns the average payload bytes of up to SAMPLE_ENTRIES entries from `first`
        (up to `last`), or None when there are none to read."""
        payloads: list[bytes] = []
        try:
            reader = self._client.open_reader(name)
            for chunk in reader.read_columns(first, min(last, first + SAMPLE_ENTRIES - 1)):
                payloads.extend(chunk.payloads)
        except (StreamNotFoundError, EntryTrimmedError):
            return None  # gone or trimmed meanwhile: the next trigger looks again
        return sum(map(len, payloads)) / len(payloads) if payloads else None

    def all_bounds(self, *, missing_ok: bool) -> dict[str, StreamBounds]:
        """Returns the bounds of every stream of `names()`. A stream listed in `streams` that
        does not exist raises, unless `missing_ok` (then it is left out)."""
        out: dict[str, StreamBounds] = {}
        for name in self.names():
            try:
                out[name] = self.bounds(name)
            except StreamNotFoundError:
                if not missing_ok and self._options.streams:
                    raise ConnectorOptionError(
                        f"stream {name!r} of option 'streams' does not exist",
                        option="streams",
                        stream=name,
                    ) from None
        return out

    def resolve(
        self, positions: Positions, option: str, bounds: dict[str, StreamBounds], default: str
    ) -> Offsets:
        """Returns the next entry id per stream that `positions` (earliest / latest / JSON)
        means now; streams missing from a JSON position take `default`."""
        out: dict[str, int] = {}
        for name, b in bounds.items():
            if isinstance(positions, dict):
                wanted = positions.get(name, EARLIEST if default == "earliest" else LATEST)
            else:
                wanted = EARLIEST if positions == "earliest" else LATEST
            if wanted == EARLIEST:
                out[name] = b.first_retained
            elif wanted == LATEST:
                out[name] = b.next_entry_id
            else:
                out[name] = wanted
        if isinstance(positions, dict):
            _check_read(positions, option, bounds)
        return ordered(out)

    def resolve_start(self, bounds: dict[str, StreamBounds], default: str) -> Offsets:
        """Returns where the read starts in each stream: at the first entry at or after its
        start time for the streams the time options name, else where `startingOffsets`
        (or `default`) says."""
        start = self.resolve(self._options.starting, "startingOffsets", bounds, default)
        if isinstance(self._options.starting_times, dict):
            _check_read(self._options.starting_times, "startingOffsetsByTimestamp", bounds)
        for name, b in bounds.items():
            ts_ms = self._options.start_time(name)
            if ts_ms is not None:
                start[name] = self.first_at_or_after(name, ts_ms, b)
        return ordered(start)

    def first_at_or_after(self, name: str, ts_ms: int, b: StreamBounds) -> int:
        """Returns the id of the stream's first entry stamped at or after `ts_ms`. Without
        one: its next entry id with startingOffsetsByTimestampStrategy=latest, else raises
        `ConnectorOptionError`."""
        reader = self._client.open_reader(name)
        entry_id = min(reader.seek_time(ts_ms), b.next_entry_id)
        log.info(
            "spark.start_time",
            stream=name,
            ts_ms=ts_ms,
            entry_id=entry_id,
            reads=reader.last_seek_reads,
        )
        if entry_id < b.next_entry_id or self._options.starting_time_strategy == "latest":
            return entry_id
        option = self._options.start_time_option
        raise ConnectorOptionError(
            f"option {option!r}: stream {name!r} has no entry stamped at or after {ts_ms} ms "
            "(set startingOffsetsByTimestampStrategy=latest to start such a stream at its end)",
            option=option,
            stream=name,
            ts_ms=ts_ms,
        )

    def plan(
        self, start: Offsets, end: Offsets, bounds: dict[str, StreamBounds]
    ) -> list[StreamRange]:
        """Returns the partitions reading `start..end` (end exclusive) of every stream. A
        start below the first retained entry is data loss: it raises `DataLossError` with
        `failOnDataLoss`, else it is logged and skipped. A stream new to the query (absent
        from `start`) starts at its first retained entry. Partitions end at fragment
        boundaries and hold at most `entriesPerPartition` entries; with `minPartitions`, the
        largest are cut further until there are at least that many (or one per entry)."""
        pieces: list[tuple[str, int, int]] = []
        stream_ids: dict[str, int | None] = {}
        for name in sorted(end):
            b = bounds.get(name)
            if b is None:
                try:
                    b = self.bounds(name)
                except StreamNotFoundError:
                    log.warning("spark.stream_gone", stream=name)
                    continue
            stream_ids[name] = b.stream_id
            first = start.get(name, b.first_retained)
            if first < b.first_retained:
                first = self.on_data_loss(name, first, b.first_retained, end[name])
            last = min(end[name], b.next_entry_id) - 1
            for lo, hi in split_range(
                first, last, b.fragment_firsts, self._options.entries_per_partition
            ):
                pieces.append((name, lo, hi))
        if self._options.min_partitions is not None:
            pieces = at_least(pieces, self._options.min_partitions)
        return [
            StreamRange(
                self._options.metadata,
                name,
                lo,
                hi,
                self._options.fail_on_data_loss,
                self._options.tls,
                self._options.metadata_auth_file,
                self._options.include_headers,
                stream_ids[name],
            )
            for name, lo, hi in pieces
        ]

    def on_data_loss(self, name: str, wanted: int, first_retained: int, end: int) -> int:
        """Returns where to go on when entries from `wanted` on were trimmed (first retained
        now `first_retained`), or raises `DataLossError` with `failOnDataLoss`."""
        return handle_trimmed(name, wanted, first_retained, end, self._options.fail_on_data_loss)


def _check_read(named: dict[str, int], option: str, bounds: dict[str, StreamBounds]) -> None:
    """Raises `ConnectorOptionError` when `option` names streams the query does not read."""
    unknown = sorted(set(named) - set(bounds))
    if unknown:
        raise ConnectorOptionError(
            f"option {option!r} names streams that are not read: {', '.join(unknown)}",
            option=option,
        )


def handle_trimmed(
    name: str, wanted: int, first_retained: int, end: int, fail_on_data_loss: bool
) -> int:
    """Returns the next entry to read after finding `wanted..first_retained - 1` trimmed, or
    raises `DataLossError` when `fail_on_data_loss`."""
    if fail_on_data_loss:
        raise DataLossError(
            f"entries {wanted}..{first_retained - 1} of stream {name!r} were trimmed by "
            "retention before the query read them; set failOnDataLoss=false to skip them",
            stream=name,
            entry_id=wanted,
            first_entry_id=first_retained,
        )
    log.warning(
        "spark.data_loss_skipped",
        stream=name,
        first_missing=wanted,
        first_retained=first_retained,
        end=end,
    )
    return first_retained
