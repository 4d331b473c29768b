"""BP-46 on real processes, bookies without the journal (`journal_write_data = false`): under
continuous appends, one bookie at a time is killed with SIGKILL (never AQ of a write set at
once: the next one only once the previous one is repaired) and restarted, round after round;
in the second test its data directory is also wiped and `auto_fix_cookie = true` rebuilds it.

After every restart: the restarted bookie never answers an explicit negative for an entry it
should hold (limbo), every stream it was in leaves limbo (phase two), and then holds every
acknowledged entry its write sets give it. At the end: no acknowledged entry lost or changed,
and every bookie of each entry's write set returns the same bytes (no divergence).

Three streams on four bookies, with writers that re-engage (reengage=True). "hot" (E3 W3 A2)
and "striped" (E3 W2 A2) take continuous appends: their writers replace the killed bookie by the
spare one (ensemble change), so the restarted bookie is no longer in their last fragment and
phase two only copies. "idle" (E3 W3 A2) is written in a burst shortly before each kill: its
quiet writer does not notice the kill, the restarted bookie is still in its last fragment, so
phase two runs a takeover; at the next burst the writer sees INVALID_TERM once and takes over
again.
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import random
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from stream.client import StreamClient, WriterOptions
from stream.client.info import StreamInfo
from stream.protocol.quorum import QuorumConfig
from stream.sandbox.bookies import BookieProcess
from stream.sandbox.cluster import SandboxCluster
from stream.wire import bookie_pb2 as pb
from stream.wire import bookie_pb2_grpc
from tests.integration.conftest import ClusterFactory

pytestmark = pytest.mark.integration

# Small flush interval: each kill loses the last ~100 ms of acknowledged entries on the victim.
BOOKIE_SETTINGS = {
    "journal_write_data": False,
    "flush_interval_ms": 100,
    "metadata_session_timeout_ms": 4000,
}
STREAMS = {"hot": (3, 3, 2), "striped": (3, 2, 2), "idle": (3, 3, 2)}
RATES_PER_S = {"hot": 100.0, "striped": 30.0}
IDLE_BURST = 20
# Bounds on one round (failure deadlines, not waits: a round takes ~1-3 s on an idle machine).
START_DEADLINE_S = 120.0
REPAIR_DEADLINE_S = 120.0
NEGATIVE_CODES = {pb.NO_SUCH_ENTRY, pb.NO_SUCH_STREAM}
# How many of the victim's acknowledged entries are probed per stream while it repairs: the
# newest (the likeliest lost) and a random sample of the rest.
PROBE_NEWEST = 40
PROBE_RANDOM = 20


@dataclass
class Appender:
    """Appends to one stream, from a thread at a steady rate or in bursts, recording what was
    acknowledged (entry id -> payload) and how many appends failed (unknown fate)."""

    client: StreamClient
    name: str
    rate_per_s: float | None
    acked: dict[int, bytes] = field(default_factory=dict)
    failed: collections.Counter[str] = field(default_factory=collections.Counter)
    fatal: BaseException | None = None

    def __post_init__(self) -> None:
        self.writer = self.client.open_writer(self.name, reengage=True)
        self.first_term = self.writer.term
        self._lock = threading.Lock()
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _append(self) -> concurrent.futures.Future[int]:
        payload = f"{self.name}:{self._seq}:".encode() * 3
        self._seq += 1
        future = self.writer.append_async(payload)

        def done(f: object) -> None:
            error = future.exception()
            with self._lock:
                if error is None:
                    self.acked[future.result()] = payload
                else:
                    self.failed[type(error).__name__] += 1

        future.add_done_callback(done)
        return future

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"append-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self.rate_per_s is not None
        interval = 1.0 / self.rate_per_s
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                self._append()
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    self._stop.wait(delay)
                else:
                    next_at = time.monotonic()  # behind: do not burst to catch up
        except BaseException as e:  # the writer failed for good: the test reports it
            self.fatal = e

    def burst(self, count: int, timeout_s: float = 30.0) -> None:
        """Appends `count` entries and waits for their outcomes (a failure is counted)."""
        futures = [self._append() for _ in range(count)]
        concurrent.futures.wait(futures, timeout_s)

    def snapshot(self) -> dict[int, bytes]:
        with self._lock:
            return dict(self.acked)

    def stop(self) -> None:
        """Stops the appending thread (if any) and waits for what was appended."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.writer.flush()


class Placement:
    """Which bookies a stream's metadata (as `stream_info` shows it) puts each entry on."""

    def __init__(self, info: StreamInfo) -> None:
        self.info = info
        self._firsts = [f.first_entry_id for f in info.fragments]
        self._config = QuorumConfig(info.ensemble_size, info.write_quorum, info.ack_quorum)

    def holds(self, bookie_id: str, entry_id: int) -> bool:
        """Returns whether `entry_id`'s write set names `bookie_id`."""
        index = bisect.bisect_right(self._firsts, entry_id) - 1
        if index < 0:
            return False
        ensemble = self.info.fragments[index].ensemble
        return bookie_id in self._config.write_set_bookies(ensemble, entry_id)


# A channel that reconnects within ~50 ms, so that probes reach a restarting bookie as soon as
# it listens (phase two starts right then).
PROBE_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 20),
    ("grpc.min_reconnect_backoff_ms", 20),
    ("grpc.max_reconnect_backoff_ms", 50),
]


class Prober:
    """Normal reads to one bookie over a quickly reconnecting channel."""

    def __init__(self, bookie: BookieProcess) -> None:
        self.bookie = bookie
        self._channel = grpc.insecure_channel(bookie.address, options=PROBE_CHANNEL_OPTIONS)
        self._stub = bookie_pb2_grpc.BookieStub(self._channel)

    def read_code(self, stream_id: int, entry_id: int, *, wait_s: float = 0.0) -> int | None:
        """Returns the code of a normal Read, None when the call failed (an unknown answer).
        With `wait_s`, first waits up to that long for the bookie to listen."""
        try:
            response = self._stub.Read(
                pb.ReadRequest(stream_id=stream_id, entry_id=entry_id),
                timeout=max(wait_s, 5.0),
                wait_for_ready=wait_s > 0,
            )
        except grpc.RpcError:
            return None
        return response.code

    def stream_state(self, stream_id: int) -> pb.StreamStateResponse | None:
        try:
            return self._stub.StreamState(pb.StreamStateRequest(stream_id=stream_id), timeout=5)
        except grpc.RpcError:
            return None

    def close(self) -> None:
        self._channel.close()


@dataclass
class RoundLog:
    probes: collections.Counter[str] = field(default_factory=collections.Counter)
    start_s: list[float] = field(default_factory=list)
    repair_s: list[float] = field(default_factory=list)


def probe_ids(
    placement: Placement, bookie_id: str, acked: dict[int, bytes], rng: random.Random
) -> list[int]:
    """Returns the newest acknowledged ids the bookie should hold (the likeliest lost) and a
    random sample of the older ones."""
    mine = [i for i in sorted(acked) if placement.holds(bookie_id, i)]
    newest, rest = mine[-PROBE_NEWEST:], mine[:-PROBE_NEWEST]
    return newest + rng.sample(rest, min(PROBE_RANDOM, len(rest)))


def check_restarted_bookie(
    client: StreamClient,
    victim: BookieProcess,
    placements: dict[str, Placement],
    before: dict[str, dict[int, bytes]],
    recent_from: dict[str, int],
    log: RoundLog,
    rng: random.Random,
) -> None:
    """From the moment the restarted victim listens (its repair starts then): no explicit
    negative for an acknowledged entry it should hold; then every stream leaves limbo and the
    victim holds every acknowledged entry its write sets give it (all those since the previous
    round, and a sample of the older ones). `placements`: the metadata as of the kill."""
    probes = {
        name: probe_ids(placements[name], victim.bookie_id, before[name], rng) for name in STREAMS
    }
    stream_ids = {name: placements[name].info.stream_id for name in STREAMS}
    prober = Prober(victim)
    try:
        started = time.monotonic()
        first = next(((n, ids[0]) for n, ids in probes.items() if ids), None)
        if first is not None:
            # Blocks until the bookie listens: the first probe lands as phase two starts.
            while prober.read_code(stream_ids[first[0]], first[1], wait_s=5.0) is None:
                assert victim.running, f"{victim.bookie_id} exited:\n{victim.log_tail(15)}"
                assert time.monotonic() - started < START_DEADLINE_S, victim.log_tail(15)
        else:
            victim.wait_ready(START_DEADLINE_S)
        serving = time.monotonic()
        log.start_s.append(serving - started)
        deadline = serving + REPAIR_DEADLINE_S
        pending = dict(stream_ids)
        while pending:
            for name, stream_id in list(pending.items()):
                for entry_id in probes[name]:
                    code = prober.read_code(stream_id, entry_id)
                    log.probes[pb.Code.Name(code) if code is not None else "ERROR"] += 1
                    if code in NEGATIVE_CODES:
                        # False unless the metadata moved the entry away from it meanwhile.
                        placement = Placement(client.stream_info(name))
                        assert not placement.holds(victim.bookie_id, entry_id), (
                            f"{victim.bookie_id} answered {pb.Code.Name(code)} for "
                            f"acknowledged entry {entry_id} of {name}, which it should hold"
                        )
                state = prober.stream_state(stream_id)
                if state is not None and state.code == pb.OK and not state.limbo:
                    del pending[name]
                elif state is not None and state.code == pb.NO_SUCH_STREAM:
                    # Never in one of the stream's fragments: phase one had nothing to protect.
                    info = client.stream_info(name)
                    assert not any(victim.bookie_id in f.ensemble for f in info.fragments), name
                    del pending[name]
            if pending:
                assert time.monotonic() < deadline, (
                    f"{victim.bookie_id} still in limbo for {sorted(pending)}:\n"
                    f"{victim.log_tail(15)}"
                )
                time.sleep(0.02)
        log.repair_s.append(time.monotonic() - serving)
    finally:
        prober.close()
    # Repaired: what it should hold of what was acknowledged before the kill, it holds.
    for name in STREAMS:
        info = client.stream_info(name)
        placement = Placement(info)
        mine = [i for i in sorted(before[name]) if placement.holds(victim.bookie_id, i)]
        recent = [i for i in mine if i >= recent_from[name]]
        older = [i for i in mine if i < recent_from[name]]
        ids = sorted(recent + rng.sample(older, min(200, len(older))))
        copy = bookie_copy(victim, info.stream_id, ids)
        lacking = [i for i in ids if i not in copy]
        assert not lacking, f"{name}: {victim.bookie_id} lacks {lacking[:20]} after repair"
        assert all(copy[i] == before[name][i] for i in ids), name


def bookie_copy(bookie: BookieProcess, stream_id: int, ids: list[int]) -> dict[int, bytes]:
    """Returns what `bookie` returns for `ids` (ascending), one ReadRange per run of
    consecutive ids."""
    found: dict[int, bytes] = {}
    runs: list[list[int]] = []
    for entry_id in ids:
        if runs and runs[-1][-1] + 1 == entry_id:
            runs[-1].append(entry_id)
        else:
            runs.append([entry_id])
    for run in runs:
        request = pb.ReadRangeRequest(
            stream_id=stream_id, first_entry_id=run[0], last_entry_id=run[-1]
        )
        for response in bookie.stub().ReadRange(request, timeout=30):
            for entry in response.entries:
                found[entry.entry_id] = entry.payload
    return found


def check_final_state(
    cluster: SandboxCluster, client: StreamClient, appenders: dict[str, Appender]
) -> None:
    """No acknowledged entry lost or changed; every bookie of each write set agrees."""
    for name, appender in appenders.items():
        acked = appender.snapshot()
        assert acked, name
        # The writers flushed; their last explicit LAC may still be on its way.
        deadline = time.monotonic() + 20
        while (info := client.stream_info(name)).lac < max(acked):
            assert time.monotonic() < deadline, f"{name}: LAC stays at {info.lac}"
            time.sleep(0.05)
        read = {e.entry_id: e.payload for e in client.open_reader(name).read(0, info.lac)}
        missing = [i for i in acked if i not in read]
        assert not missing, f"{name}: acknowledged entries lost: {missing[:20]}"
        changed = [i for i, p in acked.items() if read[i] != p]
        assert not changed, f"{name}: acknowledged entries changed: {changed[:20]}"
        # No divergence: each bookie of each entry's write set holds the same bytes.
        placement = Placement(info)
        for bookie in cluster.bookies:
            ids = [i for i in range(info.lac + 1) if placement.holds(bookie.bookie_id, i)]
            copy = bookie_copy(bookie, info.stream_id, ids)
            lacking = [i for i in ids if i not in copy]
            assert not lacking, f"{name}: {bookie.bookie_id} lacks {lacking[:20]}"
            differ = [i for i in ids if i in read and copy[i] != read[i]]
            assert not differ, (
                f"{name}: {bookie.bookie_id} diverges at {differ[:20]}: "
                + ", ".join(
                    f"{i}: holds {copy[i][:40]!r}, read {read[i][:40]!r}" for i in differ[:5]
                )
            )


@pytest.fixture
def workload(cluster_factory: ClusterFactory, request: pytest.FixtureRequest) -> Iterator[tuple]:
    settings = {**BOOKIE_SETTINGS, **getattr(request, "param", {})}
    cluster = cluster_factory(4, **settings)
    options = WriterOptions(ensemble_change_deadline_s=30.0)
    client = StreamClient.connect(cluster.metadata, writer_options=options)
    appenders: dict[str, Appender] = {}
    try:
        for name, (e, w, a) in STREAMS.items():
            client.create_stream(name, ensemble=e, write_quorum=w, ack_quorum=a)
            appenders[name] = Appender(client, name, RATES_PER_S.get(name))
            if name in RATES_PER_S:
                appenders[name].start()
        yield cluster, client, appenders
    finally:
        for appender in appenders.values():
            appender._stop.set()
        for appender in appenders.values():
            try:
                appender.stop()
                appender.writer.close()
            except Exception:  # the test already failed; keep closing
                pass
        client.close()


def wait_lac_published(
    cluster: SandboxCluster, client: StreamClient, name: str, lac: int, timeout_s: float = 5.0
) -> bool:
    """Returns True once a bookie of the stream's last fragment reports a LAC >= `lac` (the
    writer's explicit LAC went out, so it is quiet now), False after `timeout_s`."""
    info = client.stream_info(name)
    bookies = [cluster.bookie(b) for b in info.fragments[-1].ensemble]
    request = pb.StreamStateRequest(stream_id=info.stream_id)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(b.stub().StreamState(request, timeout=5).lac >= lac for b in bookies):
            return True
        time.sleep(0.02)
    return False


def run_rounds(
    cluster: SandboxCluster,
    client: StreamClient,
    appenders: dict[str, Appender],
    rounds: int,
    *,
    wipe: bool,
) -> RoundLog:
    rng = random.Random(46)
    log = RoundLog()
    recent_from = {name: 0 for name in STREAMS}
    for round_ in range(rounds):
        for appender in appenders.values():
            assert appender.fatal is None, f"{appender.name} writer failed: {appender.fatal!r}"
        appenders["idle"].burst(IDLE_BURST)
        # Once its explicit LAC went out the idle writer is quiet: it notices the kill only at
        # its next append (if not, it replaces the victim at once: a round like the others).
        wait_lac_published(cluster, client, "idle", max(appenders["idle"].snapshot()))
        victim = cluster.bookies[round_ % len(cluster.bookies)]
        placements = {name: Placement(client.stream_info(name)) for name in STREAMS}
        victim.kill9()
        before = {name: a.snapshot() for name, a in appenders.items()}
        if wipe:
            shutil.rmtree(victim.data_dir / "data")
        victim.start()
        check_restarted_bookie(client, victim, placements, before, recent_from, log, rng)
        recent_from = {name: max(before[name], default=-1) + 1 for name in STREAMS}
    return log


def summary(log: RoundLog, appenders: dict[str, Appender]) -> str:
    """Returns the run's figures (printed with -s)."""
    return (
        f"probes {dict(log.probes)}; start s max {max(log.start_s):.2f}; repair s max "
        f"{max(log.repair_s):.2f} mean {sum(log.repair_s) / len(log.repair_s):.2f}; "
        + "; ".join(
            f"{n}: {len(a.acked)} acked, failed {dict(a.failed)}, term {a.first_term}->"
            f"{a.writer.term}"
            for n, a in appenders.items()
        )
    )


@pytest.mark.timeout(600)  # ~1.5 min on an idle 2-core machine; restarts slow down under load
def test_kill9_one_bookie_at_a_time_20_rounds(workload: tuple) -> None:
    cluster, client, appenders = workload
    log = run_rounds(cluster, client, appenders, 20, wipe=False)
    for appender in appenders.values():
        appender.stop()
    check_final_state(cluster, client, appenders)
    idle = appenders["idle"]
    # Phase two took "idle" over whenever the restarted bookie was in its last fragment; its
    # writer saw INVALID_TERM and took over again each time, losing nothing acknowledged.
    assert idle.writer.term >= idle.first_term + 2 * 5
    print(summary(log, appenders), flush=True)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("workload", [{"auto_fix_cookie": True}], indirect=True)
def test_wiped_bookie_rebuilds_itself_with_auto_fix_cookie(workload: tuple) -> None:
    cluster, client, appenders = workload
    log = run_rounds(cluster, client, appenders, 8, wipe=True)
    for appender in appenders.values():
        appender.stop()
    check_final_state(cluster, client, appenders)
    assert "cookie.fixed" in cluster.bookies[0].log_path.read_text()
    print(summary(log, appenders), flush=True)
