"""`writeStream.format("streamkeeper").option("stream", NAME)`: appends each row's `payload`
(binary or string) to the stream. Tasks hand their payloads to the batch's commit, which
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
from dataclasses import dataclass

import pyarrow as pa
import structlog
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from spark_connector.clients import client_for
from spark_connector.options import SinkOptions
from stream.client import StreamWriter as ClientWriter
from stream.errors import InvalidArgumentError, StreamError
from stream.protocol.producers import EPOCH_BITS

log = structlog.get_logger(__name__)

PAYLOAD = "payload"


@dataclass
class Payloads(WriterCommitMessage):
    """One task's payloads, in row order."""

    payloads: list[bytes]


def payloads_of(batch: pa.RecordBatch) -> list[bytes]:
    """Returns the batch's `payload` column as bytes (strings UTF-8 encoded); a null payload
    raises `StreamError`."""
    column = batch.column(batch.schema.get_field_index(PAYLOAD))
    if column.null_count:
        raise StreamError("the payload column holds nulls; an entry needs a payload")
    values = column.to_pylist()
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return [v.encode() for v in values]
    return values


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
        self._options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        payloads: list[bytes] = []
        for batch in iterator:
            payloads.extend(payloads_of(batch))
        return Payloads(payloads)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        count = sum(len(m.payloads) for m in messages if isinstance(m, Payloads))
        if count == 0:
            return
        payloads = [p for m in messages if isinstance(m, Payloads) for p in m.payloads]
        client = client_for(self._options.metadata)
        producer_id = self._options.producer_id
        with client.open_writer(self._options.stream, producer_id=producer_id) as writer:
            if producer_id is None:
                futures = [writer.append_async(p) for p in payloads]
            else:
                futures = self._append_once(writer, payloads, batchId)
            writer.flush()
            first = futures[0].result()
            last = futures[-1].result()
        log.info("spark.batch_appended", stream=self._options.stream, batch=batchId,
                 entries=count, first_entry_id=first, last_entry_id=last,
                 producer_id=producer_id)

    def _append_once(
        self, writer: ClientWriter, payloads: list[bytes], batch_id: int
    ) -> list[concurrent.futures.Future[int]]:
        """Appends the batch's rows numbered as its epoch; the rows a first attempt wrote
        are duplicates (nothing is written, their futures are done at once)."""
        if len(payloads) >= 1 << EPOCH_BITS:
            raise StreamError(
                f"a micro-batch holds at most {(1 << EPOCH_BITS) - 1} rows for the exactly-once "
                "sink; bound it (e.g. maxEntriesPerTrigger)",
                stream=self._options.stream,
                rows=len(payloads),
            )
        base = batch_id << EPOCH_BITS
        return [writer.append_async(p, sequence=base + i) for i, p in enumerate(payloads)]

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("spark.batch_aborted", stream=self._options.stream, batch=batchId)
