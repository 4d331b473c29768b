"""Entry keys and headers on real ZooKeeper and bookie processes: they round-trip through the
writer (sync and asyncio), bulk, striped and single reads, tails and a takeover's recovered
tail; entries without them read back exactly as before; bad attributes are refused before
anything is written."""

from __future__ import annotations

import pytest

from stream.client import Entry, StreamClient
from stream.errors import InvalidArgumentError
from tests.integration.conftest import ClusterFactory

pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]


def attributes(i: int) -> tuple[bytes | None, list[tuple[str, bytes]]]:
    """Entry `i`'s key and headers: none on every third entry, an empty key or a key alone,
    repeated header names, a mapping's worth of headers."""
    if i % 3 == 0:
        return None, []
    if i % 3 == 1:
        return (b"" if i % 2 else b"key-%d" % i), []
    return b"k%d" % (i % 7), [
        ("trace", b"t%d" % i),
        ("trace", b""),
        ("\u00e9t\u00e9", bytes([i % 256])),
    ]


def append_with_attributes(client: StreamClient, name: str, count: int) -> None:
    with client.open_writer(name) as writer:
        futures = []
        for i in range(count):
            key, headers = attributes(i)
            futures.append(writer.append_async(b"payload-%d" % i, key=key, headers=headers))
        writer.flush()
        assert [f.result() for f in futures] == list(range(count))


def check_entries(entries: list[Entry], count: int) -> None:
    assert [e.entry_id for e in entries] == list(range(count))
    for i, entry in enumerate(entries):
        key, headers = attributes(i)
        assert (entry.payload, entry.key, entry.headers) == (b"payload-%d" % i, key, tuple(headers))


def test_keys_and_headers_round_trip_through_bulk_reads_and_tails(client: StreamClient) -> None:
    client.create_stream("attrs", fragment_max_entries=700)
    count = 2_000
    append_with_attributes(client, "attrs", count)
    reader = client.open_reader("attrs")
    check_entries(list(reader.read(0, count - 1)), count)
    check_entries(list(reader.tail("earliest", timeout_s=1)), count)
    columns = [c for c in reader.read_columns(0, count - 1)]
    keys = [k for c in columns for k in c.key_column()]
    headers = [h for c in columns for h in c.headers_column()]
    assert keys == [attributes(i)[0] for i in range(count)]
    assert headers == [tuple(attributes(i)[1]) for i in range(count)]


def test_keys_and_headers_round_trip_on_a_striped_ensemble(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(5)
    with StreamClient.connect(cluster.metadata) as client:
        client.create_stream("striped", ensemble=5, write_quorum=3, ack_quorum=2)
        append_with_attributes(client, "striped", 1_000)
        check_entries(list(client.open_reader("striped").read(0, 999)), 1_000)


def test_the_asyncio_writer_takes_a_mapping_of_headers(client: StreamClient) -> None:
    client.create_stream("async")
    with client.open_writer("async") as writer:
        core = writer._core  # the asyncio writer behind the synchronous one

        async def appends() -> list[int]:
            # Bad attributes raise on the caller's side before anything is queued.
            with pytest.raises(InvalidArgumentError):
                core.append_nowait(b"x", headers=[("h", "not bytes")])  # type: ignore[list-item]
            first = await core.append(b"a", key=b"k", headers={"h1": b"1", "h2": b"2"})
            second = await core.append_nowait(b"b")
            return [first, second]

        ids = client._loop.run(appends())
    assert ids == [0, 1]
    got = list(client.open_reader("async").read(0, 1))
    assert (got[0].key, got[0].headers) == (b"k", (("h1", b"1"), ("h2", b"2")))
    assert (got[1].key, got[1].headers) == (None, ())


def test_a_takeover_recovers_a_tail_of_entries_with_attributes(client: StreamClient) -> None:
    client.create_stream("taken")
    writer = client.open_writer("taken")
    futures = []
    for i in range(3_000):
        key, headers = attributes(i)
        futures.append(writer.append_async(b"payload-%d" % i, key=key, headers=headers))
    acknowledged = futures[999].result(timeout=60)
    writer.abort()  # the tail is left to the next writer's recovery
    writer.close()
    with client.open_writer("taken") as successor:
        assert successor.term == 2
        last = successor.append(b"after", key=b"k2")
    got = list(client.open_reader("taken").read(0, last))
    assert got[-1].key == b"k2"
    check_entries(got[:-1], len(got) - 1)
    assert len(got) - 1 > acknowledged


def test_plain_entries_between_entries_with_attributes_have_none(client: StreamClient) -> None:
    client.create_stream("mixed")
    with client.open_writer("mixed") as writer:
        writer.append(b"plain")
        writer.append(b"keyed", key=b"k")
        writer.append(b"plain again")
    got = list(client.open_reader("mixed").read(0, 2))
    assert [(e.key, e.headers) for e in got] == [(None, ()), (b"k", ()), (None, ())]
    assert got[0] == Entry("mixed", 0, b"plain", got[0].timestamp_ms)


def test_bad_attributes_are_refused_and_nothing_is_written(client: StreamClient) -> None:
    client.create_stream("bad")
    with client.open_writer("bad") as writer:
        for kwargs in (
            dict(key="text"),
            dict(headers=[("name", "text")]),
            dict(headers=[(b"name", b"v")]),
            dict(headers=[("only a name",)]),
            dict(headers={"h": 1}),
            dict(headers=5),
            dict(key=b"k" * (5 << 20)),  # with the payload, beyond the default max_entry_bytes
        ):
            with pytest.raises(InvalidArgumentError):
                writer.append(b"x", **kwargs)  # type: ignore[arg-type]
        assert writer.append(b"good", key=bytearray(b"k"), headers=[("h", memoryview(b"v"))]) == 0
    got = list(client.open_reader("bad").read(0, 0))
    assert (got[0].key, got[0].headers) == (b"k", (("h", b"v"),))
    assert isinstance(got[0].key, bytes)
