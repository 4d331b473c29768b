"""Entries as Arrow batches without Spark or a cluster: columns walked from a ReadRange answer
(their buffers wrapped as they are) and the same columns as lists give the same batch, of the
schema's exact types."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from spark_connector.schema import ARROW_HEADERS_SCHEMA, ARROW_SCHEMA, columns_to_batch
from stream.client.entry import EntryColumns
from stream.client.range_answer import range_answer
from stream.framing.prepare import prepare_entry
from stream.wire import bookie_pb2 as pb

pytestmark = pytest.mark.spark


def _answer(with_attributes: bool) -> bytes:
    entries = [
        prepare_entry(3, 10, 0, 1_700_000_000_000, b"first").entry(),
        prepare_entry(3, 11, 1, 1_700_000_000_001, b"").entry(),  # a no-op: left out
        prepare_entry(3, 12, 0, 1_700_000_000_002, b"").entry(),  # an empty payload
        prepare_entry(
            3,
            13,
            0,
            1_700_000_000_003,
            b"x" * 300,
            key=b"k" if with_attributes else None,
            headers=(("h", b"v"),) if with_attributes else (),
        ).entry(),
    ]
    return pb.ReadRangeResponse(code=pb.OK, entries=entries).SerializeToString()


@pytest.mark.parametrize("with_attributes", [False, True])
@pytest.mark.parametrize("include_headers", [False, True])
def test_walked_columns_and_lists_give_the_same_batch(
    with_attributes: bool, include_headers: bool
) -> None:
    walked = range_answer(3, 10, _answer(with_attributes)).columns
    as_lists = EntryColumns(
        list(walked.packed().to_lists()[0]),
        *walked.packed().to_lists()[1:],
        dict(walked.attributes),
    )
    batch = columns_to_batch("s", walked, include_headers)
    assert batch.equals(columns_to_batch("s", as_lists, include_headers))
    assert batch.schema.equals(ARROW_HEADERS_SCHEMA if include_headers else ARROW_SCHEMA)
    assert batch.column("entry_id").to_pylist() == [10, 12, 13]
    assert batch.column("payload").to_pylist() == [b"first", b"", b"x" * 300]
    assert [t.timestamp() for t in batch.column("timestamp").to_pylist()] == [
        1_700_000_000.000,
        1_700_000_000.002,
        1_700_000_000.003,
    ]
    assert batch.column("key").to_pylist() == [None, None, b"k" if with_attributes else None]
    assert batch.slice(1, 2).column("payload").to_pylist() == [b"", b"x" * 300]
