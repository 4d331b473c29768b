"""CursorStore against a real ZooKeeper: create on first commit, versioned monotone commits,
reset, racing commits, bounds on names and count, deletion with the stream; and the pure lag
arithmetic (`cursor_lag`)."""

from __future__ import annotations

import threading

import pytest

from stream.errors import (
    CursorNotFoundError,
    CursorRegressionError,
    InvalidArgumentError,
    StreamNotFoundError,
)
from stream.metadata import (
    MAX_CURSORS_PER_STREAM,
    CursorStore,
    Fragment,
    MetadataSession,
    StreamMeta,
    StreamStore,
    cursor_lag,
    paths,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def streams(session: MetadataSession) -> StreamStore:
    return StreamStore(session)


@pytest.fixture
def cursors(session: MetadataSession) -> CursorStore:
    return CursorStore(session, clock_ms=lambda: 5_000)


@pytest.fixture
def stream(streams: StreamStore) -> StreamMeta:
    return streams.create_stream("orders", 3, 3, 2, 100, 1 << 20)


def test_a_cursor_exists_from_its_first_commit_and_moves_forward_only(
    cursors: CursorStore, stream: StreamMeta
) -> None:
    assert cursors.get(stream.id, "billing") is None
    assert cursors.commit(stream.id, "billing", 10).entry_id == 10
    position, version = cursors.get(stream.id, "billing") or (None, None)
    assert position is not None and (position.entry_id, position.committed_ms) == (10, 5_000)
    cursors.commit(stream.id, "billing", 10)  # the same position: nothing written
    assert cursors.get(stream.id, "billing") == (position, version)
    cursors.commit(stream.id, "billing", 25)
    with pytest.raises(CursorRegressionError) as refused:
        cursors.commit(stream.id, "billing", 24)
    assert refused.value.context["position"] == 25
    assert cursors.list(stream.id)["billing"].entry_id == 25
    cursors.commit(stream.id, "billing", -1, reset=True)
    assert cursors.list(stream.id)["billing"].entry_id == -1


def test_several_cursors_and_their_deletion(cursors: CursorStore, stream: StreamMeta) -> None:
    cursors.commit(stream.id, "a", 1)
    cursors.commit(stream.id, "b", 2)
    assert {n: p.entry_id for n, p in cursors.list(stream.id).items()} == {"a": 1, "b": 2}
    cursors.delete(stream.id, "a")
    assert cursors.names(stream.id) == ["b"]
    with pytest.raises(CursorNotFoundError):
        cursors.delete(stream.id, "a")


def test_bad_names_and_ids_change_nothing(cursors: CursorStore, stream: StreamMeta) -> None:
    for name in ("", "a/b", ".", "..", "x" * 129, "sp ace"):
        with pytest.raises(InvalidArgumentError):
            cursors.commit(stream.id, name, 1)
    for entry_id in (-2, 1.5, True, "3"):
        with pytest.raises(InvalidArgumentError):
            cursors.commit(stream.id, "ok", entry_id)  # type: ignore[arg-type]
    assert cursors.names(stream.id) == []


def test_a_stream_holds_a_bounded_number_of_cursors(
    cursors: CursorStore, stream: StreamMeta
) -> None:
    for i in range(MAX_CURSORS_PER_STREAM):
        cursors.commit(stream.id, f"c{i}", 0)
    with pytest.raises(InvalidArgumentError, match="at most"):
        cursors.commit(stream.id, "one-more", 0)
    cursors.commit(stream.id, "c0", 1)  # existing ones still commit
    assert len(cursors.names(stream.id)) == MAX_CURSORS_PER_STREAM


def test_racing_commits_keep_the_highest(
    connect: object, cursors: CursorStore, stream: StreamMeta
) -> None:
    others = [CursorStore(connect()) for _ in range(4)]  # type: ignore[operator]
    errors: list[BaseException] = []

    def commit_range(store: CursorStore, start: int) -> None:
        for entry_id in range(start, 200, 4):
            try:
                store.commit(stream.id, "shared", entry_id)
            except CursorRegressionError:
                pass  # another thread went further: refused, as it must be
            except BaseException as e:
                errors.append(e)

    threads = [threading.Thread(target=commit_range, args=(s, i)) for i, s in enumerate(others)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert cursors.list(stream.id)["shared"].entry_id == 199


def test_cursors_go_with_their_stream(
    session: MetadataSession, streams: StreamStore, cursors: CursorStore, stream: StreamMeta
) -> None:
    cursors.commit(stream.id, "a", 3)
    cursors.commit(stream.id, "b", 4)
    streams.delete_stream("orders")
    assert session.zk.exists(paths.stream(stream.id)) is None
    with pytest.raises(StreamNotFoundError):
        cursors.commit(stream.id, "a", 5)  # never recreates the deleted stream's directory
    assert session.zk.exists(paths.stream(stream.id)) is None


def test_lag_counts_entries_and_bytes_behind_the_lac() -> None:
    fragments = [
        Fragment(0, ("b1",), last_entry_id=9, bytes=1000),
        Fragment(10, ("b1",), last_entry_id=19, bytes=3000),
        Fragment(20, ("b1",)),  # open: its entries count at the sized average (200 bytes)
    ]
    lag = cursor_lag(14, 29, 0, fragments)
    assert (lag.entries, lag.bytes) == (15, 5 * 300 + 10 * 200)
    assert cursor_lag(None, 29, 0, fragments).entries == 30
    assert cursor_lag(29, 29, 0, fragments).bytes == 0
    # Below the first retained entry, only what is retained counts.
    assert cursor_lag(3, 29, 10, fragments[1:]).entries == 20
    # Nothing closed yet: the bytes are unknown.
    assert cursor_lag(-1, 4, 0, [Fragment(0, ("b1",))]).bytes is None
