"""`writeStream.format("streamkeeper").option("stream", NAME)`: appends each row's `payload`
(binary or string) to the stream. Tasks hand their payloads to the batch's commit, which
appends them with one writer (one term per batch: a stream has one writer at a time, and
parallel tasks would take it over from each other; each takeover also writes a truncate no-op)
and returns once every entry is acknowledged, so Spark marks the batch done only after that.
A batch run again after a failed commit or a crash before Spark recorded the commit appends
its rows again (at-least-once, like Spark's Kafka sink; docs/spark.md spells out the rules)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import structlog
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from spark_connector.clients import client_for
from spark_connector.options import SinkOptions
from stream.errors import InvalidArgumentError, StreamError

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
        options = self._options
        client = client_for(options.metadata, options.tls, options.metadata_auth_file)
        with client.open_writer(self._options.stream) as writer:
            futures = [
                writer.append_async(p)
                for m in messages
                if isinstance(m, Payloads)
                for p in m.payloads
            ]
            writer.flush()
            first = futures[0].result()
            last = futures[-1].result()
        log.info("spark.batch_appended", stream=self._options.stream, batch=batchId,
                 entries=count, first_entry_id=first, last_entry_id=last)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("spark.batch_aborted", stream=self._options.stream, batch=batchId)
