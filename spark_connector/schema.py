"""The rows the `streamkeeper` source produces: the Spark schema and the Arrow batches that
carry it (their types must match what Spark expects for the schema exactly)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:  # the client stack stays out of the processes that only ask for the schema
    from stream.client import EntryColumns

SCHEMA = "stream STRING, entry_id LONG, payload BINARY, timestamp TIMESTAMP, key BINARY"
# With option includeHeaders = true: Kafka's shape of headers.
HEADERS_SCHEMA = SCHEMA + ", headers ARRAY<STRUCT<key: STRING, value: BINARY>>"

# Spark's Arrow mapping of SCHEMA (pyspark.sql.pandas.types.to_arrow_type, timezone "UTC").
_ARROW_FIELDS: list[pa.Field[Any]] = [
    pa.field("stream", pa.string()),
    pa.field("entry_id", pa.int64()),
    pa.field("payload", pa.binary()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("key", pa.binary()),
]
ARROW_SCHEMA = pa.schema(_ARROW_FIELDS)
HEADERS_TYPE = pa.list_(
    pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
)
ARROW_HEADERS_SCHEMA = ARROW_SCHEMA.append(pa.field("headers", HEADERS_TYPE))

_INCLUDE_HEADERS = "includeheaders"  # as Spark hands it over: lower-cased
_TIMESTAMP_MS_TYPE = pa.timestamp("ms", tz="UTC")
_TIMESTAMP_TYPE = ARROW_SCHEMA.field("timestamp").type


def source_schema(options: Mapping[str, str]) -> str:
    """Returns the schema of the source's rows for `options` (headers with includeHeaders =
    true; a value other than true or false is refused later, by the option parser)."""
    for name, value in options.items():
        if name.lower() == _INCLUDE_HEADERS and value.strip().lower() == "true":
            return HEADERS_SCHEMA
    return SCHEMA


def columns_to_batch(
    stream: str, columns: EntryColumns, include_headers: bool = False
) -> pa.RecordBatch:
    """Returns the entries of `stream` given as columns (as the client's `read_columns`
    yields them) as one Arrow record batch of ARROW_SCHEMA (ARROW_HEADERS_SCHEMA with
    `include_headers`). The ids, payloads and timestamps are the columns' packed buffers
    (`EntryColumns.packed()`: as the compiled walker filled them, wrapped without a copy);
    the stream name is repeated and the milliseconds widened to microseconds inside Arrow, not
    per entry in Python; keys and headers of a batch whose entries have none are all-null
    columns."""
    packed = columns.packed()
    count = len(packed)
    arrays: list[pa.Array[Any]] = [
        pa.repeat(pa.scalar(stream, pa.string()), count),
        pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(packed.ids)]),
        pa.Array.from_buffers(
            pa.binary(), count, [None, pa.py_buffer(packed.offsets), pa.py_buffer(packed.data)]
        ),
        pa.Array.from_buffers(
            _TIMESTAMP_MS_TYPE, count, [None, pa.py_buffer(packed.timestamps_ms)]
        ).cast(_TIMESTAMP_TYPE),
    ]
    schema = ARROW_HEADERS_SCHEMA if include_headers else ARROW_SCHEMA
    if not columns.attributes:
        arrays.append(pa.nulls(count, pa.binary()))
        if include_headers:
            arrays.append(pa.nulls(count, HEADERS_TYPE))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
    arrays.append(pa.array(columns.key_column(), pa.binary()))
    if include_headers:
        rows = [
            [{"key": name, "value": value} for name, value in headers] if headers else None
            for headers in columns.headers_column()
        ]
        arrays.append(pa.array(rows, HEADERS_TYPE))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
