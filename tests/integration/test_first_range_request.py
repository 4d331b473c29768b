"""A range read's first ReadRange request asks for `range_first_entries` (1,024): the caller
gets its first entries once that many are read, not after a whole answer of
`range_batch_bytes` (8 MiB for a Spark task); the rest of the range follows in full answers."""

from __future__ import annotations

from typing import Any

import pytest

from stream.client import ReaderOptions, StreamClient
from stream.client.grpc_transport import GrpcTransport
from stream.sandbox.cluster import SandboxCluster

pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The `(first, last)` of every ReadRange request this process's clients make."""
    made: list[tuple[int, int]] = []
    original = GrpcTransport.read_range_raw

    def recording(
        self: Any, bookie_id: str, stream_id: int, first: int, last: int, **kw: Any
    ) -> Any:
        made.append((first, last))
        return original(self, bookie_id, stream_id, first, last, **kw)

    monkeypatch.setattr(GrpcTransport, "read_range_raw", recording)
    return made


@pytest.fixture(scope="module")
def stream(module_cluster: SandboxCluster) -> str:
    with StreamClient.connect(module_cluster.metadata) as c:
        c.create_stream("first-request", fragment_max_entries=100_000)
        with c.open_writer("first-request") as writer:
            for i in range(3000):
                writer.append_async(b"e%d" % i)
            writer.flush()
    return "first-request"


def test_the_first_request_asks_for_range_first_entries_then_the_rest_in_one(
    client: StreamClient, stream: str, requests: list[tuple[int, int]]
) -> None:
    reader = client.open_reader(stream, options=ReaderOptions(range_first_entries=100))
    chunks = list(reader.read_columns(10, 2999))
    assert requests == [(10, 109), (110, 2999)]
    assert chunks[0].ids == list(range(10, 110))
    assert [i for c in chunks for i in c.ids] == list(range(10, 3000))
    # A read no longer than that is one request.
    requests.clear()
    assert [e.entry_id for e in reader.read(500, 599)] == list(range(500, 600))
    assert requests == [(500, 599)]


def test_by_default_the_first_request_asks_for_1024_entries(
    client: StreamClient, stream: str, requests: list[tuple[int, int]]
) -> None:
    reader = client.open_reader(stream)
    assert sum(len(c) for c in reader.read_columns(0, 2999)) == 3000
    assert requests == [(0, 1023), (1024, 2999)]
    # range_max_entries still bounds every request, the first too.
    requests.clear()
    small = client.open_reader(stream, options=ReaderOptions(range_max_entries=500))
    assert sum(len(c) for c in small.read_columns(0, 1499)) == 1500
    assert requests == [(0, 499), (500, 999), (1000, 1499)]
