"""The retention service against a real ZooKeeper and real bookie processes, through its
default (gRPC) transport: what a round deletes, what it trims on the bookies, its bounds, its
idle-stream decisions, and the leader election surviving a session expiry.

One sandbox cluster of six bookies serves the whole module; every test runs on its own
metadata sessions, and the streams it made are deleted afterwards (a round walks every stream
of the root). The bookies' own reconciliation with metadata is pushed past the module's
runtime, so whatever a bookie trimmed, the service's Trim did."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from stream.clock import SystemClock
from stream.metadata import (
    Fragment,
    MetadataSession,
    RetentionPolicy,
    StreamState,
    StreamStore,
    WriterInfo,
    paths,
)
from stream.protocol.checksum import entry_checksum
from stream.retention.fragments import StaleFragments, read_fragments
from stream.retention.policy import IdleAction
from stream.retention.service import ELECTION_PATH, RetentionService, RetentionSettings
from stream.sandbox.bookies import BookieProcess
from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.zookeeper import ZooKeeperServer
from stream.wire import bookie_pb2 as pb
from tests.unit.metadata.conftest import expire_session, wait_until
from tests.unit.retention.support import NOW_MS, build_stream, bulk_stream

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
BOOKIES = tuple(f"bookie-{i}" for i in range(1, 7))
E3 = BOOKIES[:3]


class FixedClock(SystemClock):
    """Wall time stands still (ages are the test's to set); intervals run on real time."""

    def __init__(self, now_ms: int = NOW_MS) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now


@pytest.fixture(scope="module")
def cluster(
    zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandboxCluster]:
    """Six bookie processes (`BOOKIES`) on the shared ZooKeeper, under a root of their own; no
    reconciliation round (GC) within the module's runtime."""
    with SandboxCluster(
        Path(tmp_path_factory.mktemp("retention-service")),
        bookies=len(BOOKIES),
        root=f"/streamkeeper-{uuid.uuid4().hex[:12]}",
        zookeeper=zookeeper,
        bookie_settings={"gc_interval_ms": 3_600_000},
    ) as started:
        assert tuple(b.bookie_id for b in started.bookies) == BOOKIES
        yield started


@pytest.fixture
def connect(cluster: SandboxCluster) -> Iterator[Callable[..., MetadataSession]]:
    """Returns a function opening sessions on the cluster's metadata root; closes them after."""
    sessions: list[MetadataSession] = []

    def open_session(**kwargs: float) -> MetadataSession:
        kwargs.setdefault("session_timeout_s", 6.0)
        session = MetadataSession.connect(cluster.metadata, **kwargs)
        sessions.append(session)
        return session

    yield open_session
    for session in sessions:
        session.close()


@pytest.fixture
def session(connect: Callable[..., MetadataSession]) -> MetadataSession:
    return connect()


@pytest.fixture
def zk_hosts(zookeeper: ZooKeeperServer) -> str:
    return zookeeper.hosts


@pytest.fixture
def store(session: MetadataSession, cluster: SandboxCluster) -> Iterator[StreamStore]:
    """The stream store of the cluster's root; every stream is deleted at the end of the test
    (so the next test's rounds see only its own) and every bookie is serving again."""
    store = StreamStore(session, clock_ms=lambda: NOW_MS)
    yield store
    for bookie in cluster.bookies:
        if not bookie.running:
            bookie.restart()
    for name in session.zk.get_children(paths.STREAMS_BY_NAME):
        store.delete_stream(name)


def make_service(
    session: MetadataSession,
    clock: FixedClock | None = None,
    **settings: float,
) -> RetentionService:
    """A service on the default transport: gRPC to the bookies registered in metadata."""
    return RetentionService(
        session,
        RetentionSettings(**settings),  # type: ignore[arg-type]
        clock=clock or FixedClock(),
    )


def put_entries(
    bookie: BookieProcess, stream_id: int, entry_ids: Sequence[int], timestamp_ms: int
) -> None:
    """Writes `entry_ids` (term 1, stamped `timestamp_ms`) straight to `bookie`."""
    entries = []
    for entry_id in entry_ids:
        payload = f"{stream_id}:{entry_id}".encode()
        crc = entry_checksum(stream_id, entry_id, 0, timestamp_ms, payload)
        entries.append(
            pb.Entry(entry_id=entry_id, timestamp_ms=timestamp_ms, payload=payload, crc32c=crc)
        )
    request = pb.AddRequest(stream_id=stream_id, term=1, lac=-1, lafr=-1, entries=entries)
    (response,) = list(bookie.stub().Add(iter([request]), timeout=30))
    assert list(response.codes) == [pb.OK] * len(entry_ids), response


def first_retained(bookie: BookieProcess, stream_id: int) -> int:
    """Returns the first entry id `bookie` retains of the stream (it holds the stream)."""
    state = bookie.stub().StreamState(pb.StreamStateRequest(stream_id=stream_id), timeout=10)
    assert state.code == pb.OK, state
    return int(state.first_entry_id)


def test_size_policy_deletes_the_oldest_fragments_and_trims_their_bookies(
    session: MetadataSession, store: StreamStore, cluster: SandboxCluster
) -> None:
    b1, b2, b3, b4, b5, b6 = BOOKIES
    ensembles = [(b1, b2, b3), (b2, b3, b4), (b3, b4, b5), (b4, b5, b6)]
    meta = build_stream(
        store,
        "sized",
        [(100, NOW_MS)] * 3,
        RetentionPolicy(max_bytes=150),
        ensembles=ensembles,
    )
    # Every bookie holds an entry of the stream (so it keeps a first retained id); b1 is down.
    for bookie in cluster.bookies:
        put_entries(bookie, meta.id, [0], NOW_MS)
    cluster.bookie(b1).kill9()
    report = make_service(session).run_once()
    _, _, fragments = store.get_snapshot(meta.id)
    # Only the newest closed fragment (100 bytes) fits 150; the open last one stays.
    assert [f.first_entry_id for f in fragments] == [20, 30]
    assert store.get_stream_by_id(meta.id)[0].first_entry_id == 20
    assert (report.fragments_deleted, report.bytes_deleted, report.trimmed) == (
        2,
        200,
        {meta.id: 20},
    )
    # Every bookie of the two deleted fragments is told, b1 is down: it reconciles later.
    assert (report.trims_sent, report.trims_failed) == (3, 1)
    assert {b: first_retained(cluster.bookie(b), meta.id) for b in (b2, b3, b4, b5, b6)} == {
        b2: 20,
        b3: 20,
        b4: 20,
        b5: 0,
        b6: 0,
    }
    # b1 missed it (it still held entry 0 when killed); back, it catches up from metadata.
    cluster.bookie(b1).restart()
    deadline = time.monotonic() + 30  # its first reconciliation runs as it starts serving
    while first_retained(cluster.bookie(b1), meta.id) != 20:
        assert time.monotonic() < deadline, "b1 did not reconcile with metadata"
        time.sleep(0.05)


def test_age_policy_and_streams_without_a_policy(
    session: MetadataSession, store: StreamStore
) -> None:
    aged = build_stream(
        store,
        "aged",
        [(1, NOW_MS - 3 * HOUR_MS), (1, NOW_MS - 2 * HOUR_MS), (1, NOW_MS - 10)],
        RetentionPolicy(max_age_s=3600),
        ensemble=E3,
    )
    kept = build_stream(store, "kept", [(1, 0)] * 3, ensemble=E3)
    report = make_service(session).run_once()
    assert [f.first_entry_id for f in store.get_fragments(aged.id)] == [20, 30]
    assert len(store.get_fragments(kept.id)) == 4
    assert report.streams_checked == 2
    # A second round finds nothing more to do.
    assert make_service(session).run_once().fragments_deleted == 0


def test_ten_thousand_fragments_shrink_to_the_ten_kept_in_bounded_rounds(
    session: MetadataSession, store: StreamStore
) -> None:
    meta = bulk_stream(
        session, store, "long", 10_000, 100, RetentionPolicy(max_bytes=1000), ensemble=E3
    )
    assert len(session.zk.get_children(paths.stream_fragments(meta.id))) == 10_001
    service = make_service(session, max_fragments_per_round=4000)
    deleted = [service.run_once().fragments_deleted for _ in range(4)]
    # Bounded work per round; each multi-op deletes at most 999 znodes.
    assert deleted == [4000, 4000, 1990, 0]
    names = session.zk.get_children(paths.stream_fragments(meta.id))
    assert len(names) == 11  # the ten newest closed fragments fitting 1000 bytes + the last
    meta_now, _ = store.get_stream_by_id(meta.id)
    assert meta_now.first_entry_id == 9990
    data, _ = session.zk.get(paths.stream_meta(meta.id))
    assert len(data) < 1024  # meta does not grow with the stream's history


def test_rounds_read_only_new_fragments(session: MetadataSession, store: StreamStore) -> None:
    """Closed fragments are remembered: a stream whose whole history fits its policy costs a
    round its new fragments, not its history."""
    meta = build_stream(
        store, "history", [(10, NOW_MS)] * 40, RetentionPolicy(max_bytes=10**9), ensemble=E3
    )
    service = make_service(session)
    assert service.run_once().fragments_read == 41
    # Two more rolls: the next round reads the two new fragments (the old last one, now
    # closed, and the new last one), nothing else.
    _, version = store.get_stream_by_id(meta.id)
    for first_id in (400, 410):
        done = Fragment(
            first_id, E3, created_ms=1, last_entry_id=first_id + 9, bytes=10, last_timestamp_ms=1
        )
        _, version = store.roll_fragment(
            meta.id, version, done, Fragment(first_id + 10, E3, created_ms=NOW_MS)
        )
    assert service.run_once().fragments_read == 3
    assert service.run_once().fragments_read == 1  # only the open last one


def test_a_round_is_bounded_in_streams_and_continues_where_it_stopped(
    session: MetadataSession, store: StreamStore
) -> None:
    ids = [
        build_stream(
            store, f"s{i}", [(10, NOW_MS)] * 2, RetentionPolicy(max_bytes=5), ensemble=E3
        ).id
        for i in range(5)
    ]
    service = make_service(session, max_streams_per_round=2)
    checked = [sorted(service.run_once().trimmed) for _ in range(3)]
    assert checked == [ids[0:2], ids[2:4], ids[4:5]]


def test_a_writer_that_rolls_meanwhile_does_not_lose_its_fragment(
    session: MetadataSession, store: StreamStore
) -> None:
    meta = build_stream(
        store, "racing", [(10, NOW_MS)] * 3, RetentionPolicy(max_bytes=15), ensemble=E3
    )
    service = make_service(session)
    original = service._store.trim_fragments
    rolled = []

    def roll_then_trim(stream_id: int, version: int, firsts: list[int], new_first: int):  # type: ignore[no-untyped-def]
        if not rolled:
            # A writer rolls after the service read the stream: its CAS moves meta first.
            _, current = store.get_stream_by_id(stream_id)
            done = Fragment(30, E3, created_ms=1, last_entry_id=39, bytes=10, last_timestamp_ms=1)
            store.roll_fragment(stream_id, current, done, Fragment(40, E3, created_ms=NOW_MS))
            rolled.append(True)
        return original(stream_id, version, firsts, new_first)

    service._store.trim_fragments = roll_then_trim  # type: ignore[method-assign]
    report = service.run_once()
    fragments = store.get_fragments(meta.id)
    # The stale CAS failed; the service read again and planned with the rolled fragment.
    assert [f.first_entry_id for f in fragments] == [30, 40]
    assert fragments[0].last_entry_id == 39
    assert rolled and report.fragments_deleted == 3


def test_idle_stream_takeover_is_skipped_when_nothing_calls_for_it(
    session: MetadataSession, store: StreamStore, cluster: SandboxCluster
) -> None:
    """The decisions before an idle takeover (the takeover itself is checked in
    tests/integration/test_retention_age.py): an empty last fragment, a young one, one whose
    bookies do not answer, and a live writer all leave the stream's term alone."""
    policy = RetentionPolicy(max_age_s=60)
    old = NOW_MS - HOUR_MS
    meta = build_stream(store, "idle", [(1, old)], policy, last_created_ms=old, ensemble=E3)
    b1, b2, b3 = (cluster.bookie(b) for b in E3)
    service = make_service(session)

    def term() -> int:
        return store.get_stream_by_id(meta.id)[0].term

    before = term()
    # The closed fragment [0, 9] is on every bookie, nothing in the last one [10, ..): EMPTY.
    for bookie in (b1, b2, b3):
        put_entries(bookie, meta.id, range(10), old)
    assert service.run_once().idle == {meta.id: IdleAction.EMPTY}
    # Written, but the newest entry is young.
    put_entries(b2, meta.id, [12], NOW_MS - 1000)
    assert make_service(session).run_once().idle == {meta.id: IdleAction.YOUNG}
    # Two of three bookies down: "nothing there" cannot be told, nothing is done.
    b1.kill9()
    b2.kill9()
    assert make_service(session).run_once().idle == {meta.id: IdleAction.UNKNOWN}
    for bookie in (b1, b2):
        bookie.restart(wait=False)
    for bookie in (b1, b2):
        bookie.wait_ready()
    cluster.wait_registered(len(BOOKIES))
    # Written and old, but a live writer: its bookies are not even asked.
    put_entries(b2, meta.id, [13], old)
    store.register_writer(meta.id, WriterInfo("w", "h", 1, before))
    report = make_service(session).run_once()
    assert report.idle == {} and report.idle_takeovers == 0
    store.unregister_writer(meta.id)
    # A sealed stream is never taken over.
    _, version = store.get_stream_by_id(meta.id)
    store.set_state(meta.id, version, StreamState.SEALED)
    report = make_service(session).run_once()
    assert report.idle == {} and report.idle_takeovers == 0
    assert term() == before
    # The closed fragment went by age all along, and its bookies were told.
    assert [f.first_entry_id for f in store.get_fragments(meta.id)] == [10]
    assert [first_retained(b, meta.id) for b in (b1, b2, b3)] == [10, 10, 10]


# ---------------------------------------------------------------- leader election


@pytest.fixture
def run_services(
    connect: Callable[..., MetadataSession],
) -> Iterator[Callable[[int], list[tuple[RetentionService, MetadataSession]]]]:
    """Returns `start(n)`: n services on their own sessions, each run() in a thread; all are
    stopped (and their threads joined) at the end."""
    running: list[tuple[RetentionService, threading.Thread]] = []

    def start(n: int) -> list[tuple[RetentionService, MetadataSession]]:
        made = []
        for i in range(n):
            session = connect(session_timeout_s=2.0)
            service = RetentionService(
                session,
                RetentionSettings(interval_s=0.1),
                identifier=f"svc-{i}",
                clock=FixedClock(),
            )
            thread = threading.Thread(target=service.run, daemon=True)
            thread.start()
            running.append((service, thread))
            made.append((service, session))
        return made

    yield start
    for service, _ in running:
        service.stop()
    for _, thread in running:
        thread.join(timeout=15)
        assert not thread.is_alive(), "a retention service did not stop"


def test_leadership_moves_on_session_expiry_and_the_expired_one_contends_again(
    run_services: Callable[[int], list[tuple[RetentionService, MetadataSession]]],
    store: StreamStore,
    zk_hosts: str,
) -> None:
    (a, session_a), (b, session_b) = run_services(2)
    leader = wait_until(lambda: [s for s in (a, b) if s.is_leader], what="a leader")
    assert len(leader) == 1
    first, first_session = (a, session_a) if leader[0] is a else (b, session_b)
    second = b if first is a else a
    policy = RetentionPolicy(max_bytes=10)

    def build_then_retain(name: str) -> int:
        """Returns the id of a new stream whose policy is set once it is built (a round must
        not trim it while it is built)."""
        meta = build_stream(store, name, [(10, NOW_MS)] * 4, ensemble=E3)
        store.set_retention(meta.id, policy)
        return meta.id

    first_id = build_then_retain("kept-trimmed")
    wait_until(lambda: len(store.get_fragments(first_id)) == 2, what="the first leader's trim")

    expire_session(first_session, zk_hosts)
    wait_until(lambda: second.is_leader, what="the second service to lead")
    # The expired one learns it when its client hears of the expiry (safety never relied on
    # it: every change is a CAS).
    wait_until(lambda: not first.is_leader, what="the expired one to step down")
    # The new leader keeps trimming.
    other = build_then_retain("later")
    wait_until(lambda: len(store.get_fragments(other)) == 2, what="the new leader's trim")
    # The expired one got a new session and waits on the lock: it leads once the other goes.
    wait_until(lambda: len(store._session.zk.get_children(ELECTION_PATH)) == 2, what="2 contenders")
    second.stop()
    wait_until(lambda: first.is_leader, what="the first service to lead again")
    third = build_then_retain("third")
    wait_until(lambda: len(store.get_fragments(third)) == 2, what="trim after re-election")


def test_fragment_window_reads_lazily_and_notices_a_vanished_fragment(
    session: MetadataSession, store: StreamStore
) -> None:
    meta = build_stream(store, "window", [(10, NOW_MS)] * 200, ensemble=E3)
    window = read_fragments(session, meta.id)
    assert len(window) == 201 and window.reads == 0
    assert window[-1].first_entry_id == 2000 and window.reads == 64  # one batch around it
    assert window[150:][-1] is window[-1]  # slices share what was read
    _, version = store.get_stream_by_id(meta.id)
    store.trim_fragments(meta.id, version, [0, 10], 20)
    with pytest.raises(StaleFragments):
        window[0]
