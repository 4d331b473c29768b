"""`open_reader(name, stream_id=, known_lac=)`.

By id: a reader opened by the id the caller found the stream under reads that stream's
snapshot without looking the name up, and never a stream created since under the same name.

With a known LAC: a reader opened with an LAC the caller read before opening it
(`stream_info(name)`'s `lac`, with its `stream_id`) reads at or below it without rereading
the metadata or asking the bookies for the LAC first (each Spark task opens its part's reader
so, with the LAC the driver planned the part on). Its snapshot, read after that LAC, locates
those entries: they were committed before it, and a committed entry never moves to another
fragment. Past it, or with a snapshot that went stale, the reader finds out as it always
did. A read cannot be given an LAC on its own: a reader opened earlier holds a snapshot from
before it, whose last fragment may end before entries the LAC covers (a takeover closed it
meanwhile), and a bookie of that fragment may hold other, never committed entries under
those ids (tests/sim/test_stale_reader.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from stream.client import StreamClient
from stream.client.grpc_transport import GrpcTransport
from stream.client.zk_metadata import ZkMetadata
from stream.errors import (
    EntryNotWrittenError,
    EntryTrimmedError,
    InvalidArgumentError,
    StreamNotFoundError,
)
from tests.call_counts import count_calls

pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts the metadata reads and LAC reads every client of this process makes."""
    return count_calls(
        monkeypatch,
        (GrpcTransport, "read_lac"),
        (ZkMetadata, "get_snapshot"),
        (ZkMetadata, "get_stream"),
    )


def _write(client: StreamClient, name: str, count: int, first: int = 0, **options: Any) -> int:
    """Creates stream `name` with `count` entries (`e<first>`...); returns its id."""
    client.create_stream(name, **options)
    with client.open_writer(name) as writer:
        for i in range(first, first + count):
            writer.append_async(b"e%d" % i)
        writer.flush()
    return client.stream_info(name).stream_id


def test_a_reader_opened_by_id_reads_one_snapshot_and_that_stream_only(
    client: StreamClient, calls: Counter[str]
) -> None:
    planned = _write(client, "by-id", 20)
    calls.clear()
    reader = client.open_reader("by-id", stream_id=planned)
    assert calls == Counter(get_snapshot=1)
    assert reader.stream_id == planned
    assert [e.payload for e in reader.read(0, 19)] == [b"e%d" % i for i in range(20)]
    calls.clear()
    client.open_reader("by-id")  # by name: the name's lookup too
    assert calls == Counter(get_stream=1, get_snapshot=1)

    client.delete_stream("by-id")
    renewed = _write(client, "by-id", 5, first=1000)
    with pytest.raises(StreamNotFoundError) as gone:
        client.open_reader("by-id", stream_id=planned)
    assert gone.value.context["stream_id"] == planned
    assert [e.payload for e in client.open_reader("by-id", stream_id=renewed).read(0, 4)] == [
        b"e%d" % i for i in range(1000, 1005)
    ]


def test_an_id_of_another_name_or_no_id_at_all_is_refused(client: StreamClient) -> None:
    client.create_stream("by-id-a")
    other = _write(client, "by-id-b", 1)
    with pytest.raises(StreamNotFoundError) as named:
        client.open_reader("by-id-a", stream_id=other)
    assert named.value.context["named"] == "by-id-b"
    for bad in (-1, "7", 1.5, True):
        with pytest.raises(InvalidArgumentError):
            client.open_reader("by-id-a", stream_id=bad)  # type: ignore[arg-type]


def test_a_read_within_the_known_lac_asks_neither_the_metadata_nor_the_bookies(
    client: StreamClient, calls: Counter[str]
) -> None:
    stream_id = _write(client, "known", 300)
    reader = client.open_reader("known", stream_id=stream_id, known_lac=299)
    calls.clear()
    got = [e.entry_id for e in reader.read(100, 299)]
    assert got == list(range(100, 300))
    columns = list(reader.read_columns(0, 99))
    assert [i for c in columns for i in c.ids] == list(range(100))
    assert calls == Counter()
    # Past it, a read rereads the metadata and asks for the LAC; so does every read of a
    # reader opened without one.
    with pytest.raises(EntryNotWrittenError):
        list(reader.read(0, 300))
    assert calls["get_snapshot"] == 1 and calls["read_lac"] >= 1
    plain = client.open_reader("known", stream_id=stream_id)
    calls.clear()
    assert [e.entry_id for e in plain.read(0, 9)] == list(range(10))
    assert calls["get_snapshot"] == 1 and calls["read_lac"] >= 1


def test_a_read_past_the_known_lac_still_stops_at_the_real_one(client: StreamClient) -> None:
    stream_id = _write(client, "past", 50)
    reader = client.open_reader("past", stream_id=stream_id, known_lac=40)
    with pytest.raises(EntryNotWrittenError) as unwritten:
        list(reader.read(0, 60))
    assert unwritten.value.context["lac"] == 49
    assert len(list(reader.read(0, 49))) == 50


def test_a_known_lac_needs_the_stream_id_it_was_read_under(client: StreamClient) -> None:
    # By name alone, the name may lead to a stream created since, whose entries up to that
    # LAC need not be committed.
    stream_id = _write(client, "needs-id", 5)
    with pytest.raises(InvalidArgumentError, match="stream_id"):
        client.open_reader("needs-id", known_lac=4)
    for bad in (-2, "4", 1.5, True):
        with pytest.raises(InvalidArgumentError):
            client.open_reader("needs-id", stream_id=stream_id, known_lac=bad)  # type: ignore[arg-type]


def test_a_stale_snapshot_is_reread_where_the_read_fails(client: StreamClient) -> None:
    # The reader's snapshot predates a trim: a read within the known LAC goes to the bookies
    # with it, finds the entries gone and rereads the metadata, which tells why.
    stream_id = _write(client, "stale", 350, fragment_max_entries=100)
    reader = client.open_reader("stale", stream_id=stream_id, known_lac=349)
    assert client.trim("stale", before_entry_id=250) == 200
    with pytest.raises(EntryTrimmedError) as trimmed:
        list(reader.read(150, 260))
    assert trimmed.value.context["first_entry_id"] == 200
    assert [e.entry_id for e in reader.read(200, 349)] == list(range(200, 350))
