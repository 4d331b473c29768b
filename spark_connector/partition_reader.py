"""Reads one `StreamRange` in an executor and yields it as Arrow record batches."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from spark_connector.catalog import handle_trimmed
from spark_connector.clients import client_for
from spark_connector.ranges import StreamRange
from spark_connector.schema import entries_to_batch
from stream.client import Entry
from stream.errors import EntryTrimmedError

ROWS_PER_BATCH = 8192


def read_range(part: StreamRange) -> Iterator[pa.RecordBatch]:
    """Yields the entries `part.first..part.last` of `part.stream` (no-ops left out), at most
    ROWS_PER_BATCH rows per batch. Entries trimmed meanwhile raise `DataLossError`, or are
    skipped without `fail_on_data_loss`."""
    reader = client_for(part.metadata).open_reader(part.stream)
    position = part.first
    while position <= part.last:
        chunk: list[Entry] = []
        try:
            for entry in reader.read(position, part.last):
                chunk.append(entry)
                if len(chunk) == ROWS_PER_BATCH:
                    yield entries_to_batch(part.stream, chunk)
                    position = chunk[-1].entry_id + 1
                    chunk = []
        except EntryTrimmedError as trimmed:
            if chunk:
                yield entries_to_batch(part.stream, chunk)
                position = chunk[-1].entry_id + 1
            first_retained = int(trimmed.context.get("first_entry_id", position + 1))
            position = handle_trimmed(part.stream, position, first_retained, part.last + 1,
                                      part.fail_on_data_loss)
            continue
        if chunk:
            yield entries_to_batch(part.stream, chunk)
        return
