"""`open_reader(name, stream_id=)`: a reader opened by the id the caller found the stream under
reads that stream's snapshot without looking the name up (each Spark task opens its part's
stream so), and never a stream created since under the same name."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from stream.client import StreamClient
from stream.client.zk_metadata import ZkMetadata
from stream.errors import InvalidArgumentError, StreamNotFoundError

pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts the metadata reads of every client of this process."""
    counted: Counter[str] = Counter()
    for name in ("get_stream", "get_snapshot"):
        original = getattr(ZkMetadata, name)

        async def counting(self: Any, *args: Any, _name: str = name, _f: Any = original) -> Any:
            counted[_name] += 1
            return await _f(self, *args)

        monkeypatch.setattr(ZkMetadata, name, counting)
    return counted


def _write(client: StreamClient, name: str, first: int, count: int) -> int:
    with client.open_writer(name) as writer:
        for i in range(first, first + count):
            writer.append_async(b"e%d" % i)
        writer.flush()
    return client.stream_info(name).stream_id


def test_a_reader_opened_by_id_reads_one_snapshot_and_that_stream_only(
    client: StreamClient, calls: Counter[str]
) -> None:
    client.create_stream("by-id")
    planned = _write(client, "by-id", 0, 20)
    calls.clear()
    reader = client.open_reader("by-id", stream_id=planned)
    assert calls == Counter(get_snapshot=1)
    assert reader.stream_id == planned
    assert [e.payload for e in reader.read(0, 19)] == [b"e%d" % i for i in range(20)]
    calls.clear()
    client.open_reader("by-id")  # by name: the name's lookup too
    assert calls == Counter(get_stream=1, get_snapshot=1)

    client.delete_stream("by-id")
    client.create_stream("by-id")
    renewed = _write(client, "by-id", 1000, 5)
    with pytest.raises(StreamNotFoundError) as gone:
        client.open_reader("by-id", stream_id=planned)
    assert gone.value.context["stream_id"] == planned
    assert [e.payload for e in client.open_reader("by-id", stream_id=renewed).read(0, 4)] == [
        b"e%d" % i for i in range(1000, 1005)
    ]


def test_an_id_of_another_name_or_no_id_at_all_is_refused(client: StreamClient) -> None:
    client.create_stream("by-id-a")
    client.create_stream("by-id-b")
    other = _write(client, "by-id-b", 0, 1)
    with pytest.raises(StreamNotFoundError) as named:
        client.open_reader("by-id-a", stream_id=other)
    assert named.value.context["named"] == "by-id-b"
    for bad in (-1, "7", 1.5, True):
        with pytest.raises(InvalidArgumentError):
            client.open_reader("by-id-a", stream_id=bad)  # type: ignore[arg-type]
