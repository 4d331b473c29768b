"""`open_reader(name, stream_id=, known_lac=)`: a reader opened with an LAC the caller read
before opening it (`stream_info(name)`'s `lac`, with its `stream_id`) reads at or below it
without rereading the metadata or asking the bookies for the LAC first (each Spark task opens
its part's reader so, with the LAC the driver planned the part on). Its snapshot, read after
that LAC, locates those entries: they were committed before it, and a committed entry never
moves to another fragment. Past it, or with a snapshot that went stale, the reader finds out
as it always did. A read cannot be given an LAC on its own: a reader opened earlier holds a
snapshot from before it, whose last fragment may end before entries the LAC covers (a
takeover closed it meanwhile), and a bookie of that fragment may hold other, never
committed entries under those ids."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from stream.client import StreamClient
from stream.client.grpc_transport import GrpcTransport
from stream.client.zk_metadata import ZkMetadata
from stream.errors import EntryNotWrittenError, EntryTrimmedError, InvalidArgumentError

pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts the LAC reads and metadata snapshots every client of this process makes."""
    counted: Counter[str] = Counter()
    for cls, name in ((GrpcTransport, "read_lac"), (ZkMetadata, "get_snapshot")):
        original = getattr(cls, name)

        async def counting(
            self: Any, *args: Any, _name: str = name, _f: Any = original, **kwargs: Any
        ) -> Any:
            counted[_name] += 1
            return await _f(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, counting)
    return counted


def _write(client: StreamClient, name: str, count: int, **options: Any) -> int:
    """Creates stream `name` with `count` entries; returns its id."""
    client.create_stream(name, **options)
    with client.open_writer(name) as writer:
        for i in range(count):
            writer.append_async(b"e%d" % i)
        writer.flush()
    return client.stream_info(name).stream_id


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
