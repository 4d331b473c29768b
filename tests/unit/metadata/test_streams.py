"""StreamStore against a real ZooKeeper: create/read/delete, the term-atomic CAS operations,
lost replies, races between writers, trimming, the writer znode and watches."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss

from stream.errors import (
    InvalidArgumentError,
    InvalidTermError,
    MetadataError,
    StreamExistsError,
    StreamNotFoundError,
)
from stream.metadata import (
    AcceptedLoss,
    BadVersionError,
    Fragment,
    MetadataSession,
    RetentionPolicy,
    StreamMeta,
    StreamSealedError,
    StreamState,
    StreamStore,
    WriterInfo,
    paths,
)
from stream.metadata.model import MAX_ACCEPTED_LOSSES, MAX_TERM_HISTORY
from stream.metadata.streams import OP_IDS_KEPT
from tests.unit.metadata.conftest import wait_until

pytestmark = pytest.mark.integration

E3 = ("b1", "b2", "b3")


@pytest.fixture
def store(session: MetadataSession) -> StreamStore:
    return StreamStore(session, clock_ms=lambda: 1_000)


def _create(store: StreamStore, name: str = "orders", **overrides: Any) -> StreamMeta:
    args: dict[str, Any] = {
        "ensemble": 3,
        "write_quorum": 3,
        "ack_quorum": 2,
        "fragment_max_entries": 100,
        "fragment_max_bytes": 1 << 20,
    }
    args.update(overrides)
    return store.create_stream(name, **args)


def _open(store: StreamStore, meta: StreamMeta, ensemble: tuple[str, ...] = E3) -> int:
    """Takes the new stream over and opens it with a first fragment; returns the version."""
    _, version = store.get_stream_by_id(meta.id)
    taken, version, last = store.begin_takeover(meta.id, version)
    assert last is None
    _, version = store.finish_recovery(
        meta.id, version, taken.term, [], [Fragment(0, ensemble, created_ms=1)], 0
    )
    return version


def _tree(session: MetadataSession, path: str = "/") -> dict[str, bytes]:
    """Returns every znode under `path` with its data."""
    found = {}
    for child in session.zk.get_children(path):
        child_path = f"{path.rstrip('/')}/{child}"
        found[child_path] = session.zk.get(child_path)[0]
        found.update(_tree(session, child_path))
    return found


def _lose_next_reply(
    monkeypatch: pytest.MonkeyPatch,
    store: StreamStore,
    meanwhile: Callable[[], object] | None = None,
    *,
    landed: bool = True,
) -> list[int]:
    """Makes the store's next multi-op end in ConnectionLoss: it landed on the server and its
    reply was lost or, with `landed=False`, it never got there. `meanwhile` runs before the
    store hears anything (another client's change landing first). Returns a list that counts
    the multi-ops sent."""
    original = store._commit
    commits: list[int] = []

    def commit(ops: Any) -> list[Any]:
        commits.append(1)
        if len(commits) > 1:
            return original(ops)
        if landed:
            original(ops)
        if meanwhile is not None:
            meanwhile()
        raise ConnectionLoss()

    monkeypatch.setattr(store, "_commit", commit)
    return commits


# ---------------------------------------------------------------- create / read / delete


def test_create_get_list_delete(store: StreamStore, session: MetadataSession) -> None:
    retention = RetentionPolicy(max_age_s=3600, max_bytes=1 << 30)
    meta = _create(store, fragment_max_age_s=60.0, retention=retention)
    assert (meta.name, meta.id, meta.term, meta.state) == ("orders", 1, 0, StreamState.OPEN)
    assert (meta.ensemble, meta.write_quorum, meta.ack_quorum) == (3, 3, 2)
    assert meta.quorum.ensemble_coverage == 2
    assert meta.retention == retention and meta.created_ms == 1_000
    assert session.zk.get("/streams/by-name/orders")[0] == b"1"
    got, version = store.get_stream("orders")
    assert got == meta and version == 0
    assert store.get_stream_by_id(meta.id) == (meta, 0)
    assert store.get_fragments(meta.id) == []
    other = _create(store, "payments")
    assert other.id == 2
    assert store.list_streams() == ["orders", "payments"]
    assert store.stream_ids() == [1, 2]

    store.delete_stream("orders")
    assert store.list_streams() == ["payments"]
    assert session.zk.exists(paths.stream(meta.id)) is None
    with pytest.raises(StreamNotFoundError):
        store.get_stream("orders")
    with pytest.raises(StreamNotFoundError):
        store.get_stream_by_id(meta.id)
    with pytest.raises(StreamNotFoundError):
        store.delete_stream("orders")
    # Ids are never reused, even after a delete.
    assert _create(store, "orders").id == 3


def test_create_is_idempotent(store: StreamStore, session: MetadataSession) -> None:
    first = _create(store)
    again = _create(store)
    assert again == first
    assert session.zk.get(paths.STREAMS_NEXT_ID)[0] == b"2"


def test_create_whose_reply_was_lost(
    store: StreamStore, session: MetadataSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    commits = _lose_next_reply(monkeypatch, store)
    meta = _create(store)
    assert len(commits) == 1  # the lookup found the stream: no second multi-op
    assert store.get_stream("orders")[0] == meta
    assert session.zk.get(paths.STREAMS_NEXT_ID)[0] == b"2"


def test_create_with_another_config_raises(store: StreamStore) -> None:
    _create(store)
    with pytest.raises(StreamExistsError):
        _create(store, ack_quorum=1)
    with pytest.raises(StreamExistsError):
        _create(store, retention=RetentionPolicy(max_bytes=10))


@pytest.mark.parametrize(
    "overrides",
    [
        {"name": ""},
        {"name": ".."},
        {"name": "a/b"},
        {"name": "x" * 256},
        {"name": "sp ace"},
        {"ensemble": 2, "write_quorum": 3, "ack_quorum": 2},
        {"ensemble": 3, "write_quorum": 3, "ack_quorum": 0},
        {"ensemble": 3, "write_quorum": 2, "ack_quorum": 3},
        {"fragment_max_entries": 0},
        {"fragment_max_bytes": 0},
        {"fragment_max_age_s": -5},
        {"retention": "forever"},
    ],
)
def test_invalid_create_writes_nothing(
    store: StreamStore, session: MetadataSession, overrides: dict[str, Any]
) -> None:
    before = _tree(session)
    name = overrides.pop("name", "orders")
    with pytest.raises(InvalidArgumentError):
        _create(store, name, **overrides)
    assert _tree(session) == before


def test_concurrent_creates_get_distinct_ids(
    connect: Callable[..., MetadataSession],
) -> None:
    stores = [StreamStore(connect()) for _ in range(3)]
    barrier = threading.Barrier(len(stores))
    created: list[StreamMeta] = []

    def create_some(index: int, store: StreamStore) -> None:
        barrier.wait()
        for n in range(5):
            created.append(_create(store, f"s-{index}-{n}"))
        created.append(_create(store, "shared"))

    threads = [threading.Thread(target=create_some, args=(i, s)) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    ids = {m.id for m in created if m.name != "shared"}
    assert len(ids) == 15
    assert len({m.id for m in created if m.name == "shared"}) == 1
    assert len(stores[0].list_streams()) == 16


def test_delete_removes_writer_and_many_fragments(
    store: StreamStore, session: MetadataSession
) -> None:
    meta = _create(store)
    _open(store, meta)
    store.register_writer(meta.id, WriterInfo("w", "h", 1, 1))
    # More fragments than one multi-op may delete: the chunked path.
    txn = session.zk.transaction()
    for first in range(1, 1101):
        txn.create(paths.stream_fragment(meta.id, first), Fragment(first, E3).to_json())
    assert all(r for r in txn.commit())
    store.delete_stream("orders")
    assert session.zk.exists(paths.stream(meta.id)) is None
    assert store.list_streams() == []


def test_purge_deleted_leftovers(store: StreamStore, session: MetadataSession) -> None:
    kept, dead = _create(store, "kept"), _create(store, "dead")
    _open(store, dead)
    # What a delete that died after its first multi-op leaves: no name, no meta, the rest.
    session.zk.delete(paths.stream_by_name("dead"))
    session.zk.delete(paths.stream_meta(dead.id))
    assert store.purge_deleted_leftovers() == [dead.id]
    assert session.zk.exists(paths.stream(dead.id)) is None
    assert store.stream_ids() == [kept.id]
    assert store.purge_deleted_leftovers() == []


# ---------------------------------------------------------------- takeover and recovery


def test_takeover_recovery_and_term_history(store: StreamStore) -> None:
    meta = _create(store)
    _, v0 = store.get_stream_by_id(meta.id)
    taken, v1, last = store.begin_takeover(meta.id, v0)
    assert (taken.term, taken.state, last, v1) == (1, StreamState.IN_RECOVERY, None, v0 + 1)
    assert store.get_stream_by_id(meta.id) == (taken, v1)
    opened, v2 = store.finish_recovery(meta.id, v1, 1, [], [Fragment(0, E3)], 0)
    assert (opened.state, opened.term_history) == (StreamState.OPEN, ((1, 0),))
    assert store.get_stream_by_id(meta.id) == (opened, v2)

    # Writer 2: the last fragment comes back; recovery replaces it and adds one after the no-op.
    taken, v3, last = store.begin_takeover(meta.id, v2)
    assert taken.term == 2 and last == Fragment(0, E3)
    replaced = Fragment(0, ("b1", "b4", "b3"))
    after = Fragment(11, ("b5", "b4", "b3"))
    opened, v4 = store.finish_recovery(meta.id, v3, 2, [replaced], [after], 11)
    assert opened.term_history == ((1, 0), (2, 11))
    assert store.get_fragments(meta.id) == [replaced, after]
    meta_v, version = store.get_stream_by_id(meta.id)
    assert meta_v == opened and version == v4


def test_finish_recovery_checks(store: StreamStore) -> None:
    meta = _create(store)
    v = _open(store, meta)
    with pytest.raises(MetadataError, match="not in recovery"):
        store.finish_recovery(meta.id, v, 1, [], [], 5)
    taken, v, _ = store.begin_takeover(meta.id, v)
    with pytest.raises(InvalidTermError) as info:
        store.finish_recovery(meta.id, v, 1, [], [], 5)
    assert (info.value.term, info.value.current_term) == (1, 2)
    with pytest.raises(InvalidArgumentError, match="before the previous"):
        store.finish_recovery(meta.id, v, 2, [], [], -1)
    with pytest.raises(InvalidArgumentError, match="wrong size"):
        store.finish_recovery(meta.id, v, 2, [], [Fragment(5, ("b1", "b2"))], 5)
    with pytest.raises(MetadataError, match="not open"):
        store.roll_fragment(meta.id, v, Fragment(0, E3, last_entry_id=4), Fragment(5, E3))
    assert store.get_stream_by_id(meta.id) == (taken, v)


def test_takeover_race_has_exactly_one_winner(
    connect: Callable[..., MetadataSession],
) -> None:
    stores = [StreamStore(connect()), StreamStore(connect())]
    meta = _create(stores[0])
    for round_ in range(5):
        _, version = stores[0].get_stream_by_id(meta.id)
        barrier = threading.Barrier(2)
        outcomes: list[object] = [None, None]

        def take(
            index: int, version: int, barrier: threading.Barrier, outcomes: list[object]
        ) -> None:
            barrier.wait()
            try:
                outcomes[index] = stores[index].begin_takeover(meta.id, version)
            except BadVersionError as exc:
                outcomes[index] = exc

        threads = [
            threading.Thread(target=take, args=(i, version, barrier, outcomes)) for i in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        winners = [o for o in outcomes if isinstance(o, tuple)]
        losers = [o for o in outcomes if isinstance(o, BadVersionError)]
        assert len(winners) == 1 and len(losers) == 1, outcomes
        # The loser rereads and sees the winner's higher term.
        current, _ = stores[1].get_stream_by_id(meta.id)
        assert current.term == round_ + 1 == winners[0][0].term


def test_takeover_whose_reply_was_lost(store: StreamStore, monkeypatch: pytest.MonkeyPatch) -> None:
    meta = _create(store)
    _, version = store.get_stream_by_id(meta.id)
    commits = _lose_next_reply(monkeypatch, store)
    taken, new_version, _ = store.begin_takeover(meta.id, version)
    assert len(commits) == 1  # recognised its own op id: no second attempt
    assert taken.term == 1 and new_version == version + 1
    assert store.get_stream_by_id(meta.id) == (taken, new_version)


def test_lost_reply_then_another_writer_is_a_bad_version(
    connect: Callable[..., MetadataSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, rival = StreamStore(connect()), StreamStore(connect())
    meta = _create(store)
    _, version = store.get_stream_by_id(meta.id)
    # Before our retry looks, a rival takes over from the version we produced.
    commits = _lose_next_reply(
        monkeypatch, store, lambda: rival.begin_takeover(meta.id, version + 1)
    )
    with pytest.raises(BadVersionError) as info:
        store.begin_takeover(meta.id, version)
    assert len(commits) == 1  # it looked, saw another writer, and did not try again
    assert info.value.current_version == version + 2
    assert store.get_stream_by_id(meta.id)[0].term == 2


# A lost reply, then a same-term change by someone else (retention, a repair) before the retry
# looks: the multi-op is ours all the same, whatever came after it.

E_OTHER = ("b1", "b2", "b4")


def _rolled_once(store: StreamStore) -> tuple[int, int]:
    """Returns `(stream id, version)` of a stream open in term 1 with fragments [0..99 closed,
    100.. open]: the first one can be trimmed or repaired."""
    meta = _create(store)
    v = _open(store, meta)
    _, v = store.roll_fragment(meta.id, v, Fragment(0, E3, last_entry_id=99), Fragment(100, E3))
    return meta.id, v


def _same_term_change(rival: StreamStore, stream_id: int, kind: str) -> None:
    """Changes the stream as retention (a trim of the first fragment) or a replication worker
    (a new ensemble for the closed first fragment) does, at the current version."""
    _, version = rival.get_stream_by_id(stream_id)
    if kind == "trim":
        rival.trim_fragments(stream_id, version, [0], 100)
    else:
        repaired = Fragment(0, ("b4", "b2", "b3"), last_entry_id=99)
        rival.add_fragment(stream_id, version, repaired, replaces_first_id=True)


def _action(store: StreamStore, stream_id: int, version: int, action: str) -> Any:
    """Runs one `_commit_meta` action at `version` (a takeover first for finish_recovery)."""
    if action == "add_fragment":
        new = Fragment(150, E_OTHER)
        return store.add_fragment(stream_id, version, new, replaces_first_id=False)
    if action == "roll_fragment":
        closed = Fragment(100, E3, last_entry_id=199)
        return store.roll_fragment(stream_id, version, closed, Fragment(200, E_OTHER))
    if action == "finish_recovery":
        return store.finish_recovery(stream_id, version, 2, [Fragment(100, E_OTHER)], [], 121)
    if action == "begin_takeover":
        return store.begin_takeover(stream_id, version)
    assert action == "seal"
    return store.set_state(stream_id, version, StreamState.SEALED)


def _its_effect(meta: StreamMeta, fragments: list[Fragment], action: str) -> bool:
    if action == "add_fragment":
        return fragments[-1] == Fragment(150, E_OTHER)
    if action == "roll_fragment":
        return fragments[-2:] == [Fragment(100, E3, last_entry_id=199), Fragment(200, E_OTHER)]
    if action == "finish_recovery":
        return meta.state is StreamState.OPEN and meta.term_history[-1] == (2, 121)
    if action == "begin_takeover":
        return meta.term == 2 and meta.state is StreamState.IN_RECOVERY
    return meta.state is StreamState.SEALED


ACTIONS = ("add_fragment", "roll_fragment", "finish_recovery", "begin_takeover", "seal")


@pytest.mark.parametrize("later", ["trim", "repair"])
@pytest.mark.parametrize("action", ACTIONS)
def test_lost_reply_then_a_same_term_change_is_still_ours(
    connect: Callable[..., MetadataSession],
    monkeypatch: pytest.MonkeyPatch,
    action: str,
    later: str,
) -> None:
    store, rival = StreamStore(connect()), StreamStore(connect())
    stream_id, v = _rolled_once(store)
    if action == "finish_recovery":
        _, v, _ = store.begin_takeover(stream_id, v)
    commits = _lose_next_reply(
        monkeypatch, store, lambda: _same_term_change(rival, stream_id, later)
    )
    got = _action(store, stream_id, v, action)
    assert len(commits) == 1  # recognised its own landed op: no second attempt
    meta, version, fragments = rival.get_snapshot(stream_id)
    # What it returns is the stream as it is now: its own change and the later one.
    assert (got[0], got[1]) == (meta, version) and version == v + 2
    assert _its_effect(meta, fragments, action)
    if later == "trim":
        assert meta.first_entry_id == 100 and fragments[0].first_entry_id == 100
    else:
        assert fragments[0].ensemble == ("b4", "b2", "b3")


@pytest.mark.parametrize("action", ACTIONS)
def test_lost_request_then_a_same_term_change_is_a_bad_version(
    connect: Callable[..., MetadataSession], monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    # The op never reached ZooKeeper, retention trimmed meanwhile: nothing of ours landed, and
    # the store must say so, never take the trim for its own change.
    store, rival = StreamStore(connect()), StreamStore(connect())
    stream_id, v = _rolled_once(store)
    if action == "finish_recovery":
        _, v, _ = store.begin_takeover(stream_id, v)
    commits = _lose_next_reply(
        monkeypatch, store, lambda: _same_term_change(rival, stream_id, "trim"), landed=False
    )
    with pytest.raises(BadVersionError) as info:
        _action(store, stream_id, v, action)
    assert len(commits) == 1 and info.value.current_version == v + 1
    meta, _, fragments = rival.get_snapshot(stream_id)
    assert not _its_effect(meta, fragments, action)


@pytest.mark.parametrize("action", ["add_fragment", "roll_fragment", "finish_recovery"])
def test_lost_reply_then_a_takeover_is_a_bad_version(
    connect: Callable[..., MetadataSession], monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    # Our op landed, then another writer took over: the stream is no longer ours to go on
    # with, so the caller must reread and see the newer term.
    store, rival = StreamStore(connect()), StreamStore(connect())
    stream_id, v = _rolled_once(store)
    if action == "finish_recovery":
        _, v, _ = store.begin_takeover(stream_id, v)

    def takeover() -> None:
        rival.begin_takeover(stream_id, rival.get_stream_by_id(stream_id)[1])

    _lose_next_reply(monkeypatch, store, takeover)
    with pytest.raises(BadVersionError) as info:
        _action(store, stream_id, v, action)
    assert info.value.current_version == v + 2
    assert store.get_stream_by_id(stream_id)[0].term == (3 if action == "finish_recovery" else 2)


def test_a_lost_reply_is_found_among_the_last_op_ids_only(
    connect: Callable[..., MetadataSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    # meta keeps the ids of its last few writes, not all of them: after that many later
    # changes the store can no longer tell, and says the version moved.
    store, rival = StreamStore(connect()), StreamStore(connect())
    stream_id, v = _rolled_once(store)

    def many_changes() -> None:
        for i in range(OP_IDS_KEPT):
            rival.set_retention(stream_id, RetentionPolicy(max_age_s=1000.0 + i))

    _lose_next_reply(monkeypatch, store, many_changes)
    with pytest.raises(BadVersionError):
        _action(store, stream_id, v, "add_fragment")
    data, _ = rival._zk.get(paths.stream_meta(stream_id))
    assert len(StreamMeta.from_json_with_ops(data)[1]) == OP_IDS_KEPT


def test_sealed_stream_refuses_takeover(store: StreamStore) -> None:
    meta = _create(store)
    v = _open(store, meta)
    sealed, v = store.set_state(meta.id, v, StreamState.SEALED)
    assert sealed.state is StreamState.SEALED
    with pytest.raises(StreamSealedError):
        store.begin_takeover(meta.id, v)
    with pytest.raises(StreamSealedError):
        store.set_state(meta.id, v, "OPEN")
    with pytest.raises(StreamSealedError):
        store.add_fragment(meta.id, v, Fragment(5, E3), replaces_first_id=False)
    # Repairs may still move a sealed stream's fragment to another bookie.
    _, v = store.add_fragment(meta.id, v, Fragment(0, ("b1", "b2", "b9")), replaces_first_id=True)
    assert store.get_fragments(meta.id) == [Fragment(0, ("b1", "b2", "b9"))]
    with pytest.raises(InvalidArgumentError):
        store.set_state(meta.id, v, StreamState.IN_RECOVERY)
    with pytest.raises(InvalidArgumentError):
        store.set_state(meta.id, v, "BROKEN")


# ---------------------------------------------------------------- fragments


def test_add_fragment_and_roll(store: StreamStore) -> None:
    meta = _create(store)
    v = _open(store, meta)
    # Ensemble change at the same first id replaces the fragment.
    _, v = store.add_fragment(meta.id, v, Fragment(0, ("b1", "b4", "b3")), replaces_first_id=True)
    # Ensemble change later on appends one.
    _, v = store.add_fragment(meta.id, v, Fragment(7, ("b1", "b4", "b5")), replaces_first_id=False)
    with pytest.raises(InvalidArgumentError):
        store.add_fragment(meta.id, v, Fragment(3, E3), replaces_first_id=False)
    with pytest.raises(InvalidArgumentError):
        store.add_fragment(meta.id, v, Fragment(3, E3), replaces_first_id=True)
    closed = Fragment(7, ("b1", "b4", "b5"), 1, 99, 4096, 10, 20)
    with pytest.raises(InvalidArgumentError, match="right after"):
        store.roll_fragment(meta.id, v, closed, Fragment(101, E3))
    with pytest.raises(InvalidArgumentError, match="last fragment"):
        store.roll_fragment(
            meta.id, v, Fragment(0, ("b1", "b4", "b3"), last_entry_id=6), Fragment(7, E3)
        )
    with pytest.raises(InvalidArgumentError, match="last_entry_id"):
        store.roll_fragment(meta.id, v, Fragment(7, ("b1", "b4", "b5")), Fragment(100, E3))
    rolled, v2 = store.roll_fragment(meta.id, v, closed, Fragment(100, E3))
    assert v2 == v + 1 and rolled.term == 1
    assert store.get_fragments(meta.id) == [
        Fragment(0, ("b1", "b4", "b3")),
        closed,
        Fragment(100, E3),
    ]


def test_every_cas_fails_on_a_stale_version(store: StreamStore, session: MetadataSession) -> None:
    meta = _create(store)
    stale = _open(store, meta)
    _, current = store.add_fragment(meta.id, stale, Fragment(0, E3), replaces_first_id=True)
    before = _tree(session)
    attempts: list[Callable[[], object]] = [
        lambda: store.begin_takeover(meta.id, stale),
        lambda: store.add_fragment(meta.id, stale, Fragment(5, E3), replaces_first_id=False),
        lambda: store.add_fragment(meta.id, stale, Fragment(0, E3), replaces_first_id=True),
        lambda: store.roll_fragment(
            meta.id, stale, Fragment(0, E3, last_entry_id=4), Fragment(5, E3)
        ),
        lambda: store.set_state(meta.id, stale, StreamState.SEALED),
        lambda: store.trim_fragments(meta.id, stale, [], 3),
        lambda: store.finish_recovery(meta.id, stale, 1, [], [], 0),
    ]
    for attempt in attempts:
        with pytest.raises(BadVersionError) as info:
            attempt()
        assert info.value.current_version == current
    assert _tree(session) == before


def test_trim_fragments(store: StreamStore) -> None:
    meta = _create(store)
    v = _open(store, meta)
    for first in (10, 20, 30):
        closed = Fragment(first - 10, E3, last_entry_id=first - 1)
        _, v = store.roll_fragment(meta.id, v, closed, Fragment(first, E3))
    with pytest.raises(InvalidArgumentError, match="last fragment"):
        store.trim_fragments(meta.id, v, [0, 10, 20, 30], 40)
    with pytest.raises(InvalidArgumentError, match="oldest"):
        store.trim_fragments(meta.id, v, [10], 20)
    with pytest.raises(InvalidArgumentError, match="first fragment kept"):
        store.trim_fragments(meta.id, v, [0, 10], 15)
    with pytest.raises(InvalidArgumentError):
        store.trim_fragments(meta.id, v, [5], 15)
    trimmed, v = store.trim_fragments(meta.id, v, [0, 10], 20)
    assert trimmed.first_entry_id == 20
    assert [f.first_entry_id for f in store.get_fragments(meta.id)] == [20, 30]
    # An explicit trim inside a fragment moves first_entry_id without deleting.
    trimmed, v = store.trim_fragments(meta.id, v, [], 25)
    assert trimmed.first_entry_id == 25
    with pytest.raises(InvalidArgumentError, match="backwards"):
        store.trim_fragments(meta.id, v, [], 24)
    with pytest.raises(InvalidArgumentError, match="last fragment"):
        store.trim_fragments(meta.id, v, [20, 30], 40)
    assert store.get_stream_by_id(meta.id) == (trimmed, v)


def test_set_retention(store: StreamStore) -> None:
    meta = _create(store)
    policy = RetentionPolicy(max_bytes=1 << 30)
    updated, v = store.set_retention(meta.id, policy)
    assert updated.retention == policy
    assert store.set_retention(meta.id, policy) == (updated, v)  # unchanged: no write
    cleared, _ = store.set_retention(meta.id, None)
    assert cleared.retention is None
    with pytest.raises(InvalidArgumentError):
        store.set_retention(meta.id, {"max_bytes": 5})  # type: ignore[arg-type]
    with pytest.raises(StreamNotFoundError):
        store.set_retention(999, policy)


# ---------------------------------------------------------------- writer znode


def test_writer_registration(connect: Callable[..., MetadataSession]) -> None:
    first_session, second_session = connect(), connect()
    store, other = StreamStore(first_session), StreamStore(second_session)
    meta = _create(store)
    assert not store.writer_alive(meta.id)
    store.register_writer(meta.id, WriterInfo("w1", "host-a", 11, 1))
    assert store.writer_alive(meta.id)
    store.register_writer(meta.id, WriterInfo("w1", "host-a", 11, 1))  # ours: an update
    with pytest.raises(InvalidTermError):
        other.register_writer(meta.id, WriterInfo("w0", "host-b", 12, 0))
    with pytest.raises(MetadataError, match="same term"):
        other.register_writer(meta.id, WriterInfo("w9", "host-b", 12, 1))
    other.unregister_writer(meta.id)  # not its znode: stays
    assert store.get_writer(meta.id) == WriterInfo("w1", "host-a", 11, 1)
    # A newer term replaces the old writer's lingering znode.
    other.register_writer(meta.id, WriterInfo("w2", "host-b", 12, 2))
    assert store.get_writer(meta.id) == WriterInfo("w2", "host-b", 12, 2)
    second_session.close()  # the ephemeral znode goes with the session
    assert not store.writer_alive(meta.id)
    store.register_writer(meta.id, WriterInfo("w3", "host-a", 11, 3))
    store.unregister_writer(meta.id)
    assert store.get_writer(meta.id) is None
    with pytest.raises(StreamNotFoundError):
        store.register_writer(999, WriterInfo("w", "h", 1, 1))


# ---------------------------------------------------------------- bookie view and watches


def test_streams_with_bookie(store: StreamStore) -> None:
    a, b, c = _create(store, "a"), _create(store, "b"), _create(store, "c")
    _open(store, a, ("b1", "b2", "b3"))
    _open(store, b, ("b4", "b5", "b6"))
    vc = _open(store, c, ("b1", "b5", "b6"))
    store.set_state(c.id, vc, StreamState.SEALED)
    found = store.streams_with_bookie("b1")
    assert [(m.name, [f.ensemble for f in fs]) for m, fs in found] == [("a", [("b1", "b2", "b3")])]
    assert [m.name for m, _ in store.streams_with_bookie("b5")] == ["b"]
    assert store.streams_with_bookie("b7") == []


def test_watch_meta_and_fragments(store: StreamStore) -> None:
    meta = _create(store)
    metas: list[tuple[StreamMeta | None, int | None]] = []
    fragment_lists: list[list[Fragment]] = []
    store.watch_meta(meta.id, lambda m, v: metas.append((m, v)))
    store.watch_fragments(meta.id, fragment_lists.append)
    assert metas == [(meta, 0)] and fragment_lists == [[]]
    v = _open(store, meta)
    wait_until(lambda: metas[-1][1] == v, what="meta watch")
    assert metas[-1][0] is not None and metas[-1][0].state is StreamState.OPEN
    wait_until(lambda: fragment_lists[-1] == [Fragment(0, E3, created_ms=1)], what="fragments")
    _, v = store.roll_fragment(meta.id, v, Fragment(0, E3, last_entry_id=9), Fragment(10, E3))
    wait_until(lambda: len(fragment_lists[-1]) == 2, what="rolled fragments")
    assert fragment_lists[-1][0].last_entry_id == 9
    store.delete_stream("orders")
    wait_until(lambda: metas[-1] == (None, None), what="deletion")
    wait_until(lambda: fragment_lists[-1] == [], what="deletion of fragments")
    with pytest.raises(StreamNotFoundError):
        store.watch_meta(meta.id, lambda m, v: None)


def test_watch_stops_when_asked(store: StreamStore) -> None:
    meta = _create(store)
    seen: list[int | None] = []
    handle = store.watch_meta(meta.id, lambda m, v: seen.append(v))
    handle.stop()
    store.set_retention(meta.id, RetentionPolicy(max_bytes=1))
    store.set_retention(meta.id, RetentionPolicy(max_bytes=2))
    # Another watch that sees both changes proves the first one had its chance to fire.
    later: list[int | None] = []
    store.watch_meta(meta.id, lambda m, v: later.append(v))
    wait_until(lambda: later and later[-1] == 2, what="second watch")
    assert seen == [0]


def test_accepted_losses_are_recorded_in_recovery_and_bounded(store: StreamStore) -> None:
    meta = _create(store)
    v = _open(store, meta)

    def loss(term: int, first: int) -> AcceptedLoss:
        return AcceptedLoss(term, first, first + 100, ("b1", "b2"), "ops@host", 1_000 + term)

    with pytest.raises(MetadataError, match="not in recovery"):
        store.record_accepted_loss(meta.id, v, loss(1, 5))
    for round_ in range(MAX_ACCEPTED_LOSSES + 2):
        taken, v, _ = store.begin_takeover(meta.id, v)
        with pytest.raises(InvalidTermError):
            store.record_accepted_loss(meta.id, v, loss(taken.term - 1, 5))
        recorded, v = store.record_accepted_loss(meta.id, v, loss(taken.term, round_))
        assert recorded.state is StreamState.IN_RECOVERY
        assert recorded.accepted_losses[-1] == loss(taken.term, round_)
        opened, v = store.finish_recovery(meta.id, v, taken.term, [], [], round_ + 1)
        assert opened.accepted_losses == recorded.accepted_losses  # kept across the reopen
    stored, _ = store.get_stream_by_id(meta.id)
    # The newest MAX_ACCEPTED_LOSSES, oldest first.
    assert [x.first_entry_id for x in stored.accepted_losses] == list(
        range(2, MAX_ACCEPTED_LOSSES + 2)
    )
    with pytest.raises(BadVersionError):
        store.record_accepted_loss(meta.id, v - 1, loss(stored.term, 0))


def test_ten_thousand_takeovers_keep_the_meta_znode_flat(
    store: StreamStore, session: MetadataSession
) -> None:
    # Every takeover (each `streamctl append`, each Spark micro-batch) adds a term history
    # pair; unbounded, 10^5 of them grew the znode to 1 MB and ZooKeeper died of it.
    meta = _create(store)
    version = _open(store, meta)
    sizes = []
    for i in range(10_000):
        taken, version, last = store.begin_takeover(meta.id, version)
        assert last is not None
        _, version = store.finish_recovery(meta.id, version, taken.term, [], [], i + 1)
        if i % 1000 == 999:
            sizes.append(len(session.zk.get(paths.stream_meta(meta.id))[0]))
            assert sizes[-1] < 1024, sizes
    final, _ = store.get_stream_by_id(meta.id)
    assert final.term == 10_001
    assert len(final.term_history) == MAX_TERM_HISTORY
    assert final.term_history[-1] == (10_001, 10_000)
    # Flat: only the numbers' digits grow (from 1,000 to 10,000: ~33 bytes in all).
    assert max(sizes) - min(sizes) <= 64, sizes
    assert max(sizes) < 1024, sizes
