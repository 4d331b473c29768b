"""An executor's work: reads one `StreamRange` through this process's client and hands it to
Spark as Arrow record batches."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from spark_connector.catalog import handle_trimmed
from spark_connector.clients import client_for
from spark_connector.ranges import StreamRange
from spark_connector.schema import entries_to_batch
from stream.client import Entry
from stream.client.options import ReaderOptions
from stream.errors import EntryTrimmedError

ROWS_PER_BATCH = 8192
# ReadRange answers of 4 MiB (the client's default is 1 MiB): a bulk read of 1 KiB entries
# takes a quarter of the responses, which costs the bookie and the client less CPU per entry.
READ_OPTIONS = ReaderOptions(range_batch_bytes=4 << 20)


def read_range(part: StreamRange) -> Iterator[pa.RecordBatch]:
    """Yields the entries `part.first..part.last` of `part.stream` (no-ops left out) in
    batches of ROWS_PER_BATCH rows (the last one smaller). Entries trimmed meanwhile raise
    `DataLossError`, or are skipped without `fail_on_data_loss`."""
    reader = client_for(part.metadata).open_reader(part.stream, options=READ_OPTIONS)
    position = part.first
    while position <= part.last:
        pending: list[Entry] = []
        try:
            # The client hands over whole ReadRange answers; they are cut into batches here.
            for entries in reader.read_batches(position, part.last):
                pending += entries
                while len(pending) >= ROWS_PER_BATCH:
                    batch, pending = pending[:ROWS_PER_BATCH], pending[ROWS_PER_BATCH:]
                    yield entries_to_batch(part.stream, batch)
                    position = batch[-1].entry_id + 1
        except EntryTrimmedError as trimmed:
            if pending:
                yield entries_to_batch(part.stream, pending)
                position = pending[-1].entry_id + 1
            first_retained = int(trimmed.context.get("first_entry_id", position + 1))
            position = handle_trimmed(part.stream, position, first_retained, part.last + 1,
                                      part.fail_on_data_loss)
            continue
        if pending:
            yield entries_to_batch(part.stream, pending)
        return
