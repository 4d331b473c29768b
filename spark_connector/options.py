"""The `streamkeeper` data source's options (named after Spark's Kafka source), parsed and
checked once on the driver into a `SourceOptions` value that pickles to the executors."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from spark_connector.errors import ConnectorOptionError
from stream.errors import ConfigError, InvalidArgumentError
from stream.metadata.model import validate_producer_id, validate_stream_name
from stream.security.tls import TLSConfig

# Kafka's JSON offsets use -2 for earliest and -1 for latest; so do ours.
EARLIEST = -2
LATEST = -1

DEFAULT_ENTRIES_PER_PARTITION = 50_000

# TLS to the bookies (docs/security.md): the CA, this job's certificate and key.
_TLS_OPTIONS = ("tlsCaFile", "tlsCertFile", "tlsKeyFile")
# Spark hands options to Python sources with lower-cased keys; these are the documented names.
_READ_OPTIONS = (
    "metadata",
    "streams",
    "streamPattern",
    "startingOffsets",
    "endingOffsets",
    "maxEntriesPerTrigger",
    "maxBytesPerTrigger",
    "failOnDataLoss",
    "entriesPerPartition",
    "metadataAuthFile",
    "minPartitions",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "includeHeaders",
    *_TLS_OPTIONS,
)
_WRITE_OPTIONS = (
    "metadata",
    "stream",
    "metadataAuthFile",
    "deliveryGuarantee",
    "producerId",
    *_TLS_OPTIONS,
)
_GUARANTEES = ("exactly-once", "at-least-once")
# Spark adds these itself (e.g. `path` from `load(path)`); they are not ours to reject.
_SPARK_OPTIONS = ("path", "checkpointlocation")

# A start or end position per stream: "earliest", "latest", or {stream: entry id | -2 | -1}.
Positions = str | dict[str, int]
# Start times: one for every stream (startingTimestamp) or some streams' (by timestamp), in
# milliseconds since the Unix epoch.
StartTimes = int | dict[str, int]
# What to do with a stream that has no entry at or after its start time (Kafka's names).
TIME_STRATEGIES = ("error", "latest")


@dataclass(frozen=True)
class SourceOptions:
    """What a reader needs: `metadata` connect string, the stream list or pattern, and the
    positions and limits; every field already checked."""

    metadata: str
    streams: tuple[str, ...]
    stream_pattern: str | None
    starting: Positions
    ending: Positions
    max_entries_per_trigger: int | None
    fail_on_data_loss: bool
    entries_per_partition: int
    tls: TLSConfig | None = None
    metadata_auth_file: str | None = None  # the ZooKeeper identity (a path every executor has)
    min_partitions: int | None = None
    max_bytes_per_trigger: int | None = None
    starting_times: StartTimes | None = None
    starting_time_strategy: str = "error"

    def start_time(self, name: str) -> int | None:
        """Returns the stream's start time (ms) from the time options, or None."""
        if isinstance(self.starting_times, dict):
            return self.starting_times.get(name)
        return self.starting_times

    @property
    def start_time_option(self) -> str:
        """Returns the name of the time option in use (for messages)."""
        if isinstance(self.starting_times, dict):
            return "startingOffsetsByTimestamp"
        return "startingTimestamp"

    include_headers: bool = False

    def pattern_matches(self, name: str) -> bool:
        pattern = self.stream_pattern
        return pattern is not None and re.fullmatch(pattern, name) is not None


@dataclass(frozen=True)
class SinkOptions:
    """What the streaming writer needs: `metadata` and the target `stream`; `producer_id`
    for the exactly-once sink (None: at-least-once)."""

    metadata: str
    stream: str
    tls: TLSConfig | None = None
    metadata_auth_file: str | None = None
    producer_id: str | None = None


def _lowered(options: Mapping[str, str], known: tuple[str, ...]) -> dict[str, str]:
    names = {name.lower(): name for name in known}
    out: dict[str, str] = {}
    for key, value in options.items():
        low = key.lower()
        if low in _SPARK_OPTIONS:
            continue
        if low not in names:
            raise ConnectorOptionError(
                f"unknown option {key!r} of the streamkeeper data source; known: "
                + ", ".join(known),
                option=key,
            )
        out[names[low]] = value
    return out


def _metadata(values: dict[str, str]) -> str:
    metadata = values.get("metadata", "").strip()
    if not metadata:
        raise ConnectorOptionError(
            "option 'metadata' is required: the ZooKeeper connect string HOST:PORT/ROOT",
            option="metadata",
        )
    return metadata


def _tls(values: dict[str, str]) -> TLSConfig | None:
    """Returns the TLS files of the options (read once here, on the driver, so that a missing
    file or a loose key fails the query at once), None without `tlsCaFile`."""
    ca, cert, key = (values.get(name, "").strip() or None for name in _TLS_OPTIONS)
    if ca is None:
        if cert is not None or key is not None:
            raise ConnectorOptionError(
                "options 'tlsCertFile' and 'tlsKeyFile' need 'tlsCaFile'", option="tlsCaFile"
            )
        return None
    try:
        tls = TLSConfig(ca, cert, key)
        tls.load()
    except ConfigError as e:
        raise ConnectorOptionError(f"TLS options: {e.message}", option="tlsCaFile") from None
    return tls


def _metadata_auth_file(values: dict[str, str]) -> str | None:
    """Returns the `metadataAuthFile` option, None when not given (no ZooKeeper auth)."""
    return values.get("metadataAuthFile", "").strip() or None


def _stream_name(name: str, option: str) -> str:
    try:
        return validate_stream_name(name)
    except InvalidArgumentError as e:
        raise ConnectorOptionError(
            f"option {option!r}: {e.message}", option=option, stream=name
        ) from None


def _positive_int(values: dict[str, str], option: str) -> int | None:
    raw = values.get(option)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConnectorOptionError(
            f"option {option!r} must be a positive integer, got {raw!r}", option=option
        )
    return value


# Spark's byte strings (JavaUtils.byteStringAsBytes): binary units, case-insensitive.
_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
}


def _byte_count(values: dict[str, str], option: str) -> int | None:
    """Returns the option as a positive number of bytes: `1048576`, `512k`, `64m`, `1g`."""
    raw = values.get(option)
    if raw is None:
        return None
    found = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", raw.lower())
    if found is None or found.group(2) not in _BYTE_UNITS or int(found.group(1)) <= 0:
        raise ConnectorOptionError(
            f"option {option!r} must be a positive number of bytes (e.g. 1048576, 512k, 64m, "
            f"1g), got {raw!r}",
            option=option,
        )
    return int(found.group(1)) * _BYTE_UNITS[found.group(2)]


def _bool(values: dict[str, str], option: str, default: bool) -> bool:
    raw = values.get(option)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise ConnectorOptionError(
        f"option {option!r} must be true or false, got {raw!r}", option=option
    )


def parse_positions(
    raw: str | None, option: str, default: str, allow_latest: bool, allow_earliest: bool = True
) -> Positions:
    """Returns "earliest", "latest" or `{stream: entry id}` (entry ids >= 0, or -2 / -1)."""
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in ("earliest", "latest"):
        if (word == "latest" and not allow_latest) or (word == "earliest" and not allow_earliest):
            raise ConnectorOptionError(f"option {option!r} cannot be {word!r}", option=option)
        return word
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= EARLIEST for v in parsed.values()
    ):
        raise ConnectorOptionError(
            f"option {option!r} must be 'earliest', 'latest' or JSON like "
            f'{{"stream": next_entry_id}} (-2 earliest, -1 latest), got {raw!r}',
            option=option,
        )
    out: dict[str, int] = {}
    for name, value in parsed.items():
        _stream_name(name, option)
        if value == LATEST and not allow_latest:
            raise ConnectorOptionError(f"option {option!r} cannot use -1 (latest)", option=option)
        if value == EARLIEST and not allow_earliest:
            raise ConnectorOptionError(f"option {option!r} cannot use -2 (earliest)", option=option)
        out[name] = value
    return out


def _timestamp_ms(raw: object, option: str) -> int:
    """Returns `raw` (an int, or a string of digits) as milliseconds since the Unix epoch."""
    value = -1
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str) and raw.strip().isascii() and raw.strip().isdigit():
        value = int(raw)
    if value < 0:
        raise ConnectorOptionError(
            f"option {option!r} must be milliseconds since the Unix epoch (an integer >= 0), "
            f"got {raw!r}",
            option=option,
        )
    return value


def _starting_times(
    values: dict[str, str], streams: tuple[str, ...], starting: Positions
) -> StartTimes | None:
    """Returns startingTimestamp (every stream) or startingOffsetsByTimestamp ({stream: ms});
    startingTimestamp leaves no stream to the other two start options, so it goes alone, and
    a stream has one start: by time or by `starting` (startingOffsets), not both."""
    if "startingTimestamp" in values:
        for other in ("startingOffsetsByTimestamp", "startingOffsets"):
            if other in values:
                raise ConnectorOptionError(
                    f"option 'startingTimestamp' sets every stream's start: give it or "
                    f"{other!r}, not both",
                    option="startingTimestamp",
                )
        return _timestamp_ms(values["startingTimestamp"], "startingTimestamp")
    raw = values.get("startingOffsetsByTimestamp")
    if raw is None:
        return None
    option = "startingOffsetsByTimestamp"
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise ConnectorOptionError(
            f'option {option!r} must be JSON like {{"stream": start_time_ms}}, got {raw!r}',
            option=option,
        )
    times = {_stream_name(name, option): _timestamp_ms(ts, option) for name, ts in parsed.items()}
    if isinstance(starting, dict):
        both = sorted(set(times) & set(starting))
        if both:
            raise ConnectorOptionError(
                f"options {option!r} and 'startingOffsets' both name {', '.join(both)}",
                option=option,
            )
    extra = sorted(set(times) - set(streams)) if streams else []
    if extra:
        raise ConnectorOptionError(
            f"option {option!r} names streams not in 'streams': {', '.join(extra)}",
            option=option,
        )
    return times


def _time_strategy(values: dict[str, str]) -> str:
    option = "startingOffsetsByTimestampStrategy"
    strategy = values.get(option, "error").strip().lower()
    if strategy not in TIME_STRATEGIES:
        raise ConnectorOptionError(
            f"option {option!r} must be 'error' or 'latest', got {values[option]!r}",
            option=option,
        )
    return strategy


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Returns the checked reader options; raises `ConnectorOptionError` naming the option."""
    values = _lowered(options, _READ_OPTIONS)
    metadata = _metadata(values)
    has_streams = bool(values.get("streams", "").strip())
    has_pattern = bool(values.get("streamPattern", "").strip())
    if has_streams == has_pattern:
        raise ConnectorOptionError(
            "exactly one of the options 'streams' (comma list) and 'streamPattern' (regex) "
            "must be given",
            option="streams",
        )
    streams: tuple[str, ...] = ()
    pattern: str | None = None
    if has_streams:
        names = [s.strip() for s in values["streams"].split(",") if s.strip()]
        streams = tuple(dict.fromkeys(_stream_name(n, "streams") for n in names))
    else:
        pattern = values["streamPattern"].strip()
        try:
            re.compile(pattern)
        except re.error as e:
            raise ConnectorOptionError(
                f"option 'streamPattern' is not a valid regex: {e}", option="streamPattern"
            ) from None
    if streaming and "endingOffsets" in values:
        raise ConnectorOptionError(
            "option 'endingOffsets' applies to batch reads only", option="endingOffsets"
        )
    for option in ("maxEntriesPerTrigger", "maxBytesPerTrigger"):
        if not streaming and option in values:
            raise ConnectorOptionError(
                f"option {option!r} applies to streaming reads only", option=option
            )
    starting = parse_positions(
        values.get("startingOffsets"),
        "startingOffsets",
        "latest" if streaming else "earliest",
        allow_latest=streaming,
    )
    ending = parse_positions(
        values.get("endingOffsets"),
        "endingOffsets",
        "latest",
        allow_latest=True,
        allow_earliest=False,
    )
    for option, positions in (("startingOffsets", starting), ("endingOffsets", ending)):
        if isinstance(positions, dict) and streams:
            extra = sorted(set(positions) - set(streams))
            if extra:
                raise ConnectorOptionError(
                    f"option {option!r} names streams not in 'streams': {', '.join(extra)}",
                    option=option,
                )
    return SourceOptions(
        metadata=metadata,
        streams=streams,
        stream_pattern=pattern,
        starting=starting,
        ending=ending,
        max_entries_per_trigger=_positive_int(values, "maxEntriesPerTrigger"),
        fail_on_data_loss=_bool(values, "failOnDataLoss", True),
        entries_per_partition=_positive_int(values, "entriesPerPartition")
        or DEFAULT_ENTRIES_PER_PARTITION,
        tls=_tls(values),
        metadata_auth_file=_metadata_auth_file(values),
        min_partitions=_positive_int(values, "minPartitions"),
        max_bytes_per_trigger=_byte_count(values, "maxBytesPerTrigger"),
        starting_times=_starting_times(values, streams, starting),
        starting_time_strategy=_time_strategy(values),
        include_headers=_bool(values, "includeHeaders", False),
    )


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Returns the checked writer options; raises `ConnectorOptionError` naming the option."""
    values = _lowered(options, _WRITE_OPTIONS)
    metadata = _metadata(values)
    stream = values.get("stream", "").strip()
    if not stream:
        raise ConnectorOptionError("option 'stream' is required to write", option="stream")
    guarantee = values.get("deliveryGuarantee", "exactly-once").strip().lower()
    if guarantee not in _GUARANTEES:
        raise ConnectorOptionError(
            "option 'deliveryGuarantee' must be exactly-once or at-least-once",
            option="deliveryGuarantee",
            value=guarantee,
        )
    producer_id = None
    if guarantee == "exactly-once":
        producer_id = _sink_producer_id(options, values)
    return SinkOptions(
        metadata=metadata,
        stream=_stream_name(stream, "stream"),
        tls=_tls(values),
        metadata_auth_file=_metadata_auth_file(values),
        producer_id=producer_id,
    )


def _sink_producer_id(options: Mapping[str, str], values: dict[str, str]) -> str:
    """Returns the `producerId` option, else one derived from the query's checkpoint location
    (the same on every restart of the query, different for another query)."""
    given = values.get("producerId", "").strip()
    if given:
        try:
            return validate_producer_id(given)
        except InvalidArgumentError as e:
            raise ConnectorOptionError(
                f"option 'producerId': {e.message}", option="producerId"
            ) from None
    checkpoint = next(
        (v for k, v in options.items() if k.lower() == "checkpointlocation" and v.strip()), None
    )
    if checkpoint is None:
        raise ConnectorOptionError(
            "the exactly-once sink needs option 'checkpointLocation' or 'producerId' (or "
            "deliveryGuarantee = at-least-once)",
            option="producerId",
        )
    return "spark-" + hashlib.sha256(checkpoint.strip().encode()).hexdigest()[:16]
