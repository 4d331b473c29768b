"""The rows the `streamkeeper` source produces: the Spark schema and the Arrow batches that
carry it (their types must match what Spark expects for the schema exactly)."""

from __future__ import annotations

import pyarrow as pa

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


_TIMESTAMP_MS_TYPE = pa.timestamp("ms", tz="UTC")
_TIMESTAMP_TYPE = ARROW_SCHEMA.field("timestamp").type


def columns_to_batch(
    stream: str, ids: list[int], payloads: list[bytes], timestamps_ms: list[int]
) -> pa.RecordBatch:
    """Returns the entries of `stream` given as columns (as the client's `read_columns`
    yields them) as one Arrow record batch of ARROW_SCHEMA. Each column is built from its
    list in one call; the stream name is repeated and the milliseconds widened to
    microseconds inside Arrow, not per entry in Python."""
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(stream, pa.string()), len(ids)),
            pa.array(ids, pa.int64()),
            pa.array(payloads, pa.binary()),
            pa.array(timestamps_ms, _TIMESTAMP_MS_TYPE).cast(_TIMESTAMP_TYPE),
        ],
        schema=ARROW_SCHEMA,
    )
