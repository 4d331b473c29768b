"""The rows the `streamkeeper` source produces: the Spark schema and the Arrow batches that
carry it (their types must match what Spark expects for the schema exactly)."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import pyarrow as pa

from stream.client import Entry

SCHEMA = "stream STRING, entry_id LONG, payload BINARY, timestamp TIMESTAMP"

# Spark's Arrow mapping of SCHEMA (pyspark.sql.pandas.types.to_arrow_type, timezone "UTC").
ARROW_SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string()),
        pa.field("entry_id", pa.int64()),
        pa.field("payload", pa.binary()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


_ENTRY_ID = attrgetter("entry_id")
_PAYLOAD = attrgetter("payload")
_TIMESTAMP_MS = attrgetter("timestamp_ms")
_TIMESTAMP_MS_TYPE = pa.timestamp("ms", tz="UTC")


def entries_to_batch(stream: str, entries: Sequence[Entry]) -> pa.RecordBatch:
    """Returns `entries` (all of `stream`) as one Arrow record batch of ARROW_SCHEMA. Each
    column is built from one list in one call; the stream name is repeated and the
    milliseconds widened to microseconds inside Arrow, not per entry in Python."""
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(stream, pa.string()), len(entries)),
            pa.array(list(map(_ENTRY_ID, entries)), pa.int64()),
            pa.array(list(map(_PAYLOAD, entries)), pa.binary()),
            pa.array(list(map(_TIMESTAMP_MS, entries)), _TIMESTAMP_MS_TYPE).cast(
                ARROW_SCHEMA.field("timestamp").type
            ),
        ],
        schema=ARROW_SCHEMA,
    )
