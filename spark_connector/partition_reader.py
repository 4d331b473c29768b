"""An executor's work: reads one `StreamRange` through this process's client and hands it to
Spark as Arrow record batches."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from spark_connector.catalog import handle_trimmed
from spark_connector.clients import client_for
from spark_connector.ranges import StreamRange
from spark_connector.schema import columns_to_batch
from stream.client.options import ReaderOptions
from stream.errors import EntryTrimmedError

ROWS_PER_BATCH = 8192
# ReadRange answers of 8 MiB (the client's default is 1 MiB): a bulk read of 1 KiB entries
# takes an eighth of the responses, which costs the bookie and the client less CPU per entry,
# and hands Spark batches of about 8,000 rows (ROWS_PER_BATCH cuts larger ones), which its
# writers take in less time than twice as many of 4 MiB (docs/benchmarks.md).
READ_OPTIONS = ReaderOptions(range_batch_bytes=8 << 20)


def read_range(part: StreamRange) -> Iterator[pa.RecordBatch]:
    """Yields the entries `part.first..part.last` of `part.stream` (no-ops left out) in
    batches of at most ROWS_PER_BATCH rows: each ReadRange answer's entries as one batch over
    the buffers the client's walker filled (no copy, no Python object per entry), cut where it
    holds more. Entries trimmed meanwhile raise `DataLossError`, or are skipped without
    `fail_on_data_loss`; a stream deleted meanwhile raises `StreamNotFoundError`, also when a
    stream of its name was created since (another id)."""
    client = client_for(part.metadata, part.tls, part.metadata_auth_file)
    # By the id it was planned on: the stream itself, not one created since under its name
    # (StreamNotFoundError then), without looking the name up. With the part's end as the
    # known LAC (the driver planned it at or below an LAC it read before this task began),
    # the reads skip the metadata reread and the LAC reads.
    reader = client.open_reader(
        part.stream,
        options=READ_OPTIONS,
        stream_id=part.stream_id,
        known_lac=None if part.stream_id is None else part.last,
    )
    position = part.first
    headers = part.include_headers
    while position <= part.last:
        try:
            for chunk in reader.read_columns(position, part.last):
                batch = columns_to_batch(part.stream, chunk, headers)
                for offset in range(0, batch.num_rows, ROWS_PER_BATCH):
                    yield batch.slice(offset, ROWS_PER_BATCH)
                position = batch.column(1)[-1].as_py() + 1
        except EntryTrimmedError as trimmed:
            first_retained = int(trimmed.context.get("first_entry_id", position + 1))
            position = handle_trimmed(
                part.stream, position, first_retained, part.last + 1, part.fail_on_data_loss
            )
            continue
        return
