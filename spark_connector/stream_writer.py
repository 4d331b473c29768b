"""`writeStream.format("streamkeeper").option("stream", NAME)`: appends each row's `payload`
(binary or string) to the stream, with the row's `key` (binary or string) and `headers`
(array<struct<key: string, value: binary or string>>, Kafka's shape) when those columns
exist. Tasks hand their payloads to the batch's commit, which
appends them with one writer (one term per batch: a stream has one writer at a time, and
parallel tasks would take it over from each other; each takeover also writes a truncate no-op)
and returns once every entry is acknowledged, so Spark marks the batch done only after that.

Exactly-once (the default): the writer is the query's idempotent producer and row `i` of batch
`b` (task order, then row order) has sequence `b << EPOCH_BITS | i`, so a batch run again after
a failed commit or a crash appends only the rows its first attempt did not. At-least-once
(`deliveryGuarantee = at-least-once`): such a batch appends its rows again, like Spark's Kafka
sink. docs/spark.md spells out the rules."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import repeat
from typing import cast

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, DataType, StringType, StructType

from spark_connector.clients import client_for
from spark_connector.options import SinkOptions
from stream.client import StreamWriter as ClientWriter
from stream.errors import InvalidArgumentError, StreamError
from stream.logs import get_logger
from stream.protocol.producers import EPOCH_BITS

log = get_logger(__name__)

PAYLOAD = "payload"
KEY = "key"
HEADERS = "headers"

EntryHeaders = list[tuple[str, bytes]] | None
Row = tuple[bytes, bytes | None, EntryHeaders]


@dataclass
class Payloads(WriterCommitMessage):
    """One task's payloads, in row order, and their keys and headers when the rows have those
    columns (None: they do not)."""

    payloads: list[bytes]
    keys: list[bytes | None] | None = None
    headers: list[EntryHeaders] | None = field(default=None)

    def rows(self) -> Iterator[Row]:
        """Yields (payload, key, headers) per row."""
        return zip(
            self.payloads,
            repeat(None) if self.keys is None else self.keys,
            repeat(None) if self.headers is None else self.headers,
            strict=False,
        )


def _is_text(arrow_type: pa.DataType) -> bool:
    return bool(pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type))


def payloads_of(batch: pa.RecordBatch) -> list[bytes]:
    """Returns the batch's `payload` column as bytes (strings UTF-8 encoded); a null payload
    raises `StreamError`."""
    column = batch.column(batch.schema.get_field_index(PAYLOAD))
    if column.null_count:
        raise StreamError("the payload column holds nulls; an entry needs a payload")
    values = column.to_pylist()
    # No nulls (checked above): each value is the column's type, str or bytes.
    if _is_text(column.type):
        return [v.encode() for v in cast(list[str], values)]
    return cast(list[bytes], values)


def keys_of(batch: pa.RecordBatch) -> list[bytes | None] | None:
    """Returns the batch's `key` column as bytes or None per row (None: no such column)."""
    index = batch.schema.get_field_index(KEY)
    if index < 0:
        return None
    column = batch.column(index)
    values = column.to_pylist()
    if _is_text(column.type):
        return [None if v is None else v.encode() for v in values]
    return values


def headers_of(batch: pa.RecordBatch) -> list[EntryHeaders] | None:
    """Returns the batch's `headers` column as (name, value bytes) pairs or None per row
    (None: no such column); a header with a null name raises `StreamError`."""
    index = batch.schema.get_field_index(HEADERS)
    if index < 0:
        return None
    rows: list[EntryHeaders] = []
    for row in batch.column(index).to_pylist():
        if not row:
            rows.append(None)
            continue
        pairs = []
        for header in row:
            name, value = header["key"], header["value"]
            if name is None:
                raise StreamError("a header in the headers column has a null key")
            pairs.append((name, value.encode() if isinstance(value, str) else value or b""))
        rows.append(pairs)
    return rows


def _check_column(schema: StructType, name: str, accepted: str, ok: bool) -> None:
    if not ok:
        raise InvalidArgumentError(
            f"the streamkeeper sink's column {name!r} must be {accepted}; "
            f"got columns {schema.simpleString()}"
        )


def _is_headers_type(data_type: DataType) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in data_type.elementType.fields}
    return (
        set(fields) == {"key", "value"}
        and isinstance(fields["key"], StringType)
        and isinstance(fields["value"], BinaryType | StringType)
    )


class StreamWriter(DataSourceStreamArrowWriter):
    """Collects payloads in tasks; appends them in `commit` (on the driver side)."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        field = next((f for f in schema.fields if f.name == PAYLOAD), None)
        if field is None or not isinstance(field.dataType, BinaryType | StringType):
            raise InvalidArgumentError(
                "the streamkeeper sink needs a column 'payload' of type binary or string; "
                f"got columns {schema.simpleString()}",
                stream=options.stream,
            )
        columns = {f.name: f.dataType for f in schema.fields}
        if KEY in columns:
            _check_column(
                schema, KEY, "binary or string", isinstance(columns[KEY], BinaryType | StringType)
            )
        if HEADERS in columns:
            _check_column(
                schema,
                HEADERS,
                "array<struct<key: string, value: binary or string>>",
                _is_headers_type(columns[HEADERS]),
            )
        self._options = options

    # pyspark's DataSourceStreamArrowWriter declares this signature itself, over its base's
    # Iterator[Row]: the incompatible override is pyspark's.
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:  # type: ignore[override]
        payloads: list[bytes] = []
        keys: list[bytes | None] = []
        headers: list[EntryHeaders] = []
        has_keys = has_headers = False
        for batch in iterator:
            payloads.extend(payloads_of(batch))
            batch_keys = keys_of(batch)
            if batch_keys is not None:
                has_keys = True
                keys.extend(batch_keys)
            batch_headers = headers_of(batch)
            if batch_headers is not None:
                has_headers = True
                headers.extend(batch_headers)
        return Payloads(payloads, keys if has_keys else None, headers if has_headers else None)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        count = sum(len(m.payloads) for m in messages if isinstance(m, Payloads))
        if count == 0:
            return
        rows = [row for m in messages if isinstance(m, Payloads) for row in m.rows()]
        options = self._options
        client = client_for(options.metadata, options.tls, options.metadata_auth_file)
        producer_id = self._options.producer_id
        with client.open_writer(self._options.stream, producer_id=producer_id) as writer:
            if producer_id is None:
                futures = [writer.append_async(p, key=k, headers=h) for p, k, h in rows]
            else:
                futures = self._append_once(writer, rows, batchId)
            writer.flush()
            first = futures[0].result()
            last = futures[-1].result()
        log.info(
            "spark.batch_appended",
            stream=self._options.stream,
            batch=batchId,
            entries=count,
            first_entry_id=first,
            last_entry_id=last,
            producer_id=producer_id,
        )

    def _append_once(
        self, writer: ClientWriter, rows: list[Row], batch_id: int
    ) -> list[concurrent.futures.Future[int]]:
        """Appends the batch's rows numbered as its epoch; the rows a first attempt wrote
        are duplicates (nothing is written, their futures are done at once)."""
        if len(rows) >= 1 << EPOCH_BITS:
            raise StreamError(
                f"a micro-batch holds at most {(1 << EPOCH_BITS) - 1} rows for the exactly-once "
                "sink; bound it (e.g. maxEntriesPerTrigger)",
                stream=self._options.stream,
                rows=len(rows),
            )
        base = batch_id << EPOCH_BITS
        return [
            writer.append_async(p, key=k, headers=h, sequence=base + i)
            for i, (p, k, h) in enumerate(rows)
        ]

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("spark.batch_aborted", stream=self._options.stream, batch=batchId)
