"""The rows the `streamkeeper` source produces: the Spark schema and the Arrow batches that
carry it (their types must match what Spark expects for the schema exactly)."""

from __future__ import annotations

from collections.abc import Sequence

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


def entries_to_batch(stream: str, entries: Sequence[Entry]) -> pa.RecordBatch:
    """Returns `entries` (all of `stream`) as one Arrow record batch of ARROW_SCHEMA."""
    count = len(entries)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([stream] * count, pa.string()),
            pa.array([e.entry_id for e in entries], pa.int64()),
            pa.array([e.payload for e in entries], pa.binary()),
            pa.array([e.timestamp_ms * 1000 for e in entries], pa.int64()).cast(
                ARROW_SCHEMA.field("timestamp").type
            ),
        ],
        schema=ARROW_SCHEMA,
    )
