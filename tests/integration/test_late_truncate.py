"""A real bookie process over gRPC keeps what a term wrote after a Truncate when an older
Truncate of the same term arrives late (the simulator's lost write-quorum entry): refused, every
entry still there, also across a restart. With the test-only "truncate_order" switch the late
Truncate deletes them, which shows the check is what keeps them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stream.sandbox.bookies import BookieProcess
from stream.wire import bookie_pb2 as pb
from tests.integration.bookie_support import (
    METADATA_UNCHECKED,
    BookieFactory,
    add_all,
    add_request,
)
from tests.integration.retention_support import logged_events

pytestmark = pytest.mark.integration

STREAM = 12
TERM = 3
# The bookie ends up holding 0..59: an earlier term's 0..53, then term 3's 54..59.
HELD = 60
NEWER_AFTER = 53
LATE_AFTER = 47


@pytest.fixture
def bookies(tmp_path: Path, metadata_root: str) -> Iterator[BookieFactory]:
    # Skipped for every bookie here: these streams exist in no metadata.
    factory = BookieFactory(tmp_path, metadata_root, unsafe_skips=METADATA_UNCHECKED)
    try:
        yield factory
    finally:
        factory.stop_all()


def _held(bookie: BookieProcess) -> list[int]:
    stub = bookie.stub()
    return [
        i
        for i in range(HELD + 5)
        if stub.Read(pb.ReadRequest(stream_id=STREAM, entry_id=i), timeout=10).code == pb.OK
    ]


def _truncate(bookie: BookieProcess, after: int) -> pb.TruncateResponse:
    request = pb.TruncateRequest(stream_id=STREAM, term=TERM, after_entry_id=after)
    return bookie.stub().Truncate(request, timeout=10)


def _newer_truncate_then_writes(bookie: BookieProcess) -> None:
    add_all(bookie.stub(), [add_request(STREAM, 1, range(NEWER_AFTER + 1))])
    assert _truncate(bookie, NEWER_AFTER).code == pb.OK
    add_all(bookie.stub(), [add_request(STREAM, TERM, range(NEWER_AFTER + 1, HELD))])
    assert _held(bookie) == list(range(HELD))


def test_a_late_truncate_of_the_same_term_is_refused(bookies: BookieFactory) -> None:
    bookie = bookies.start("bookie-1")
    _newer_truncate_then_writes(bookie)

    late = _truncate(bookie, LATE_AFTER)
    assert late.code == pb.BAD_REQUEST
    assert "stale" in late.message
    assert _held(bookie) == list(range(HELD))

    # The point applied is durable with the stream's state: after a restart still refused.
    bookie.restart(clean=False)
    assert _truncate(bookie, LATE_AFTER).code == pb.BAD_REQUEST
    assert _held(bookie) == list(range(HELD))


def test_without_the_order_check_the_late_truncate_deletes_the_terms_entries(
    bookies: BookieFactory,
) -> None:
    bookies.unsafe_skips += ("truncate_order",)
    bookie = bookies.start("bookie-1")
    # The bookie says loudly which protections are off.
    (warning,) = logged_events(bookie.log_path, "bookie.unsafe_switches_on")
    assert warning["level"] == "warning"
    assert warning["switches"] == sorted([*METADATA_UNCHECKED, "truncate_order"])
    _newer_truncate_then_writes(bookie)

    assert _truncate(bookie, LATE_AFTER).code == pb.OK
    assert _held(bookie) == list(range(LATE_AFTER + 1))
