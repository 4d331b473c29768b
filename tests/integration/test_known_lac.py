"""`read(..., known_lac=)`: a read that ends at or below an LAC the caller read skips the
metadata reread and the bookies' LAC before it (each Spark task's reader gets its part's end,
which the driver planned at or below the LAC); past it, or with a snapshot that went stale,
the reader finds out as it always did."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from stream.client import StreamClient
from stream.client.grpc_transport import GrpcTransport
from stream.client.zk_metadata import ZkMetadata
from stream.errors import EntryNotWrittenError, EntryTrimmedError, InvalidArgumentError
from stream.sandbox.cluster import SandboxCluster

pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]


@pytest.fixture
def client(cluster: SandboxCluster) -> Iterator[StreamClient]:
    with StreamClient.connect(cluster.metadata) as c:
        yield c


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


def _write(client: StreamClient, name: str, count: int, **options: Any) -> None:
    client.create_stream(name, **options)
    with client.open_writer(name) as writer:
        for i in range(count):
            writer.append_async(b"e%d" % i)
        writer.flush()


def test_a_read_within_a_known_lac_asks_neither_the_metadata_nor_the_bookies(
    client: StreamClient, calls: Counter[str]
) -> None:
    _write(client, "known", 300)
    reader = client.open_reader("known")
    calls.clear()
    got = [e.entry_id for e in reader.read(100, 299, known_lac=299)]
    assert got == list(range(100, 300))
    columns = list(reader.read_columns(0, 99, known_lac=299))
    assert [i for c in columns for i in c.ids] == list(range(100))
    assert calls == Counter()
    # Without it (or past it), each read rereads the metadata and asks for the LAC.
    assert [e.entry_id for e in reader.read(0, 9)] == list(range(10))
    assert calls["get_snapshot"] == 1 and calls["read_lac"] >= 1
    calls.clear()
    assert [e.entry_id for e in reader.read(0, 299, known_lac=200)] == list(range(300))
    assert calls["get_snapshot"] == 1 and calls["read_lac"] >= 1


def test_a_read_past_the_known_lac_still_stops_at_the_real_one(client: StreamClient) -> None:
    _write(client, "past", 50)
    reader = client.open_reader("past")
    with pytest.raises(EntryNotWrittenError) as unwritten:
        list(reader.read(0, 60, known_lac=40))
    assert unwritten.value.context["lac"] == 49
    for bad in (-2, "49", 1.5, True):
        with pytest.raises(InvalidArgumentError):
            list(reader.read(0, 10, known_lac=bad))  # type: ignore[arg-type]


def test_a_stale_snapshot_is_reread_where_the_read_fails(client: StreamClient) -> None:
    # The reader's snapshot predates a trim: a read within the known LAC goes to the bookies
    # with it, finds the entries gone and rereads the metadata, which tells why.
    _write(client, "stale", 350, fragment_max_entries=100)
    reader = client.open_reader("stale")
    assert client.trim("stale", before_entry_id=250) == 200
    with pytest.raises(EntryTrimmedError) as trimmed:
        list(reader.read(150, 260, known_lac=349))
    assert trimmed.value.context["first_entry_id"] == 200
    assert [e.entry_id for e in reader.read(200, 349, known_lac=349)] == list(range(200, 350))
