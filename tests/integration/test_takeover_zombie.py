"""Terms on real processes (docs/design.md §5 "Taking over", §10 properties 1-4): a writer frozen
with SIGSTOP while another takes over, then resumed (a zombie); two re-engaging writers taking the
stream from each other in turns; and `streamctl info` showing the term history.

Every check reads the data back twice: through readers (two independent clients must see one
sequence holding every acknowledged entry with its bytes) and straight from the bookies (every
entry up to the LAC, from every bookie of its write set per the metadata's fragments, must be
there with the same bytes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from stream.client import StreamClient
from stream.client.info import StreamInfo
from stream.errors import InvalidTermError
from stream.protocol import Code, EntryFlag, QuorumConfig
from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.zookeeper import ZooKeeperServer
from stream.wire import bookie_pb2 as pb
from stream.wire import bookie_pb2_grpc
from tests.integration.cli_support import streamctl
from tests.integration.conftest import running_cluster

pytestmark = pytest.mark.integration

# Writer A, in a subprocess so that it can be frozen. It appends flat out and reports on
# stdout, one line each: `term T`, `ack ENTRY_ID INDEX` and `fail INDEX ERROR` per append (INDEX:
# its append number, which fixes its payload), `refused ERROR` when an append is refused
# (the writer stopped), then `done` once its writer and client are closed.
_ZOMBIE = r"""
import functools, sys, threading
from stream.client import StreamClient
from stream.client.options import Protections, WriterOptions
from stream.errors import StreamError
from stream.logs import configure_logging
configure_logging(json=True, level="warning")  # logs go to stderr: stdout carries the reports
metadata, name, term_fencing = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
options = WriterOptions(protections=Protections(term_fencing=term_fencing))
client = StreamClient.connect(metadata, writer_options=options)
writer = client.open_writer(name)
lock = threading.Lock()
def emit(line):
    with lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
def report(index, future):
    error = future.exception()
    if error is None:
        emit(f"ack {future.result()} {index}")
    else:
        emit(f"fail {index} {type(error).__name__}")
emit(f"term {writer.term}")
index = 0
try:
    while True:
        payload = PAYLOAD % index
        writer.append_async(payload).add_done_callback(functools.partial(report, index))
        index += 1
except StreamError as e:
    emit(f"refused {type(e).__name__}")
try:
    writer.close()
except StreamError:
    pass
client.close()
emit("done")
"""
_ZOMBIE_PAYLOAD = b"zombie-%d|" + b"z" * 40
DEADLINE_S = 60.0


def zombie_payload(index: int) -> bytes:
    return _ZOMBIE_PAYLOAD % index


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    """Polls `condition` until it holds; fails the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


class ZombieWriter:
    """Writer A: the subprocess and what it reported so far."""

    def __init__(self, metadata: str, name: str, *, term_fencing: bool = True) -> None:
        self.term = 0
        self.acks: dict[int, int] = {}  # entry id -> append index
        self.failures: dict[int, str] = {}  # append index -> error type
        self.refused: str | None = None
        self.done = False
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _ZOMBIE.replace("PAYLOAD", repr(_ZOMBIE_PAYLOAD)),
                metadata,
                name,
                "1" if term_fencing else "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            kind, *rest = line.split()
            if kind == "term":
                self.term = int(rest[0])
            elif kind == "ack":
                self.acks[int(rest[0])] = int(rest[1])
            elif kind == "fail":
                self.failures[int(rest[0])] = rest[1]
            elif kind == "refused":
                self.refused = rest[0]
            elif kind == "done":
                self.done = True

    def state(self) -> str:
        """Returns the process state letter from /proc (T: stopped)."""
        stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0]

    def freeze(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)
        wait_until(lambda: self.state() == "T", "writer A to stop")

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Ends the process whatever its state (a stopped one is continued first)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=30)
        self._reader.join(timeout=10)


@pytest.fixture(scope="module")
def cluster(
    zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandboxCluster]:
    """Three bookies shared by this module's tests (each test has its own stream)."""
    with running_cluster(zookeeper, tmp_path_factory.mktemp("takeover-zombie")) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def client(cluster: SandboxCluster) -> Iterator[StreamClient]:
    with StreamClient.connect(cluster.metadata) as c:
        yield c


# ---------------------------------------------------------------------- reading it all back


def read_everything(metadata: str, name: str, last: int) -> list[tuple[int, bytes]]:
    """Returns (entry id, payload) of entries 0..last as a new client's reader sees them."""
    with StreamClient.connect(metadata) as reader_client:
        reader = reader_client.open_reader(name)
        return [(e.entry_id, e.payload) for e in reader.read(0, last)]


def bookie_copies(
    stub: bookie_pb2_grpc.BookieStub, stream_id: int, first: int, last: int
) -> dict[int, bytes]:
    """Returns entry id -> serialized entry for what one bookie holds of first..last: ReadRange
    for the runs, a single Read to confirm each entry a range stopped at."""
    held: dict[int, bytes] = {}
    position = first
    while position <= last:
        request = pb.ReadRangeRequest(
            stream_id=stream_id, first_entry_id=position, last_entry_id=last
        )
        for response in stub.ReadRange(request, timeout=30):
            for entry in response.entries:
                held[entry.entry_id] = entry.SerializeToString()
        position = max([position - 1, *held]) + 1
        if position <= last:
            single = stub.Read(pb.ReadRequest(stream_id=stream_id, entry_id=position), timeout=30)
            if single.code == Code.OK:
                held[position] = single.entry.SerializeToString()
            position += 1
    return held


def assert_bookies_agree(cluster: SandboxCluster, info: StreamInfo, lac: int) -> int:
    """Checks that every entry up to `lac` is held by every bookie of its write set (per the
    fragments in metadata) with the same bytes; returns how many copies were compared."""
    config = QuorumConfig(info.ensemble_size, info.write_quorum, info.ack_quorum)
    stubs = {b.bookie_id: b.stub() for b in cluster.bookies}
    compared = 0
    for fragment in info.fragments:
        first = fragment.first_entry_id
        last = lac if fragment.last_entry_id is None else min(fragment.last_entry_id, lac)
        if last < first:
            continue
        held = {
            bookie_id: bookie_copies(stubs[bookie_id], info.stream_id, first, last)
            for bookie_id in fragment.ensemble
        }
        for entry_id in range(first, last + 1):
            write_set = config.write_set_bookies(fragment.ensemble, entry_id)
            copies = {b: held[b].get(entry_id) for b in write_set}
            missing = [b for b, c in copies.items() if c is None]
            assert not missing, f"entry {entry_id} is missing on {missing} of {write_set}"
            assert len(set(copies.values())) == 1, f"bookies disagree on entry {entry_id}"
            compared += len(copies)
    return compared


def noop_ids(cluster: SandboxCluster, info: StreamInfo, lac: int) -> set[int]:
    """Returns the ids up to `lac` of the no-op entries (read from one bookie per fragment)."""
    found = set()
    for fragment in info.fragments:
        first = fragment.first_entry_id
        last = lac if fragment.last_entry_id is None else min(fragment.last_entry_id, lac)
        if last < first:
            continue
        stub = cluster.bookie(fragment.ensemble[0]).stub()
        for entry_id, raw in bookie_copies(stub, info.stream_id, first, last).items():
            if pb.Entry.FromString(raw).flags & EntryFlag.NOOP:
                found.add(entry_id)
    return found


# ---------------------------------------------------------------------- the zombie


def test_frozen_writer_resumed_after_a_takeover_is_fenced_and_loses_nothing(
    client: StreamClient, cluster: SandboxCluster
) -> None:
    name = "zombie"
    client.create_stream(name)
    zombie = ZombieWriter(cluster.metadata, name)
    b_acks: dict[int, bytes] = {}
    try:
        wait_until(
            lambda: len(zombie.acks) >= 2000 or zombie.process.poll() is not None,
            "writer A to get 2000 acknowledgments",
        )
        assert zombie.process.poll() is None, "writer A exited early"
        zombie.freeze()
        writer_b = client.open_writer(name)  # takes over while A is frozen mid-stream
        try:
            assert (zombie.term, writer_b.term) == (1, 2)
            first_b = writer_b.append(b"b-0")
            b_acks[first_b] = b"b-0"
            pending: list[tuple[bytes, Future[int]]] = []
            for j in range(1, 300):
                pending.append((b"b-%d" % j, writer_b.append_async(b"b-%d" % j)))
            zombie.resume()
            # B keeps appending while A wakes up, finds its term superseded and stops.
            for j in range(300, 600):
                pending.append((b"b-%d" % j, writer_b.append_async(b"b-%d" % j)))
            wait_until(lambda: zombie.done, "writer A to report its refusal and exit")
            for payload, future in pending:
                b_acks[future.result(timeout=DEADLINE_S)] = payload
            lac = writer_b.last_add_confirmed
        finally:
            writer_b.close()
    finally:
        zombie.stop()

    # A's appends after the takeover failed with InvalidTermError, and so did its next one.
    assert zombie.refused == "InvalidTermError"
    assert zombie.failures and set(zombie.failures.values()) == {"InvalidTermError"}
    # A's acknowledgments are a prefix of its appends, all before B's truncate no-op at
    # first_b - 1; no later append of A was acknowledged.
    noop = first_b - 1
    assert sorted(zombie.acks.values()) == list(range(len(zombie.acks)))
    assert max(zombie.acks) < noop and max(zombie.failures) >= len(zombie.acks)
    assert len(zombie.acks) >= 2000
    # Never two acknowledgments for one entry id.
    assert not set(zombie.acks) & set(b_acks)

    # Two independent readers see one sequence holding every acknowledged entry, byte for byte.
    seen = read_everything(cluster.metadata, name, lac)
    assert read_everything(cluster.metadata, name, lac) == seen
    by_id = dict(seen)
    for entry_id, index in zombie.acks.items():
        assert by_id[entry_id] == zombie_payload(index), f"A's entry {entry_id} changed"
    for entry_id, payload in b_acks.items():
        assert by_id[entry_id] == payload, f"B's entry {entry_id} changed"
    # Recovered entries A never saw acknowledged are A's own bytes, in A's order; the no-op
    # is not among what readers see.
    assert [i for i, _ in seen] == [*range(noop), *range(noop + 1, lac + 1)]
    assert all(by_id[i] == zombie_payload(i) for i in range(noop))

    info = client.stream_info(name)
    assert info.term_history == [(1, 0), (2, noop)]
    assert noop_ids(cluster, info, lac) == {noop}
    assert assert_bookies_agree(cluster, info, lac) == 3 * (lac + 1)


# ---------------------------------------------------------------------- the fight


ROUNDS = 8
BURST = 200


def fighter_payload(writer: int, round_: int, index: int) -> bytes:
    return b"w%d-r%d-%d" % (writer, round_, index)


def test_two_reengaging_writers_take_turns_and_never_share_an_entry_id(
    client: StreamClient, cluster: SandboxCluster
) -> None:
    name = "fight"
    client.create_stream(name)
    # Two writers with their own connections (loops, channels, ZooKeeper sessions).
    clients = [StreamClient.connect(cluster.metadata) for _ in range(2)]
    acks: list[dict[int, bytes]] = [{}, {}]
    failed = [0, 0]
    terms: list[int] = []
    try:
        writers = [c.open_writer(name, reengage=True) for c in clients]
        assert [w.term for w in writers] == [1, 2]
        for round_ in range(ROUNDS):
            # The writer whose turn it is was taken over by the other one: its adds meet the
            # newer term and fail (everything it had in flight), it takes over again
            # (re-engages), and its next appends go into its new term.
            turn = round_ % 2
            acked_this_round = 0
            for _ in range(3):
                futures = []
                for i in range(BURST):
                    payload = fighter_payload(turn, round_, len(acks[turn]) + failed[turn] + i)
                    futures.append((payload, writers[turn].append_async(payload)))
                for payload, future in futures:
                    try:
                        acks[turn][future.result(timeout=DEADLINE_S)] = payload
                        acked_this_round += 1
                    except InvalidTermError:
                        failed[turn] += 1
                if acked_this_round:
                    break
            assert acked_this_round > 0, f"no progress in round {round_}"
            terms.append(writers[turn].term)
        lac = max(w.last_add_confirmed for w in writers)
        for w in writers:
            w.close()
    finally:
        for c in clients:
            c.close()

    # Each round was one takeover by the writer whose turn it was: terms 3, 4, ...
    assert terms == list(range(3, 3 + ROUNDS))
    assert failed[0] + failed[1] > 0  # the superseded writers did meet the newer terms
    # Never both acknowledged for one entry id; every acknowledged entry reads back unchanged,
    # and nothing else is there (a stale add is refused by every bookie).
    assert not set(acks[0]) & set(acks[1])
    everything = {**acks[0], **acks[1]}
    seen = read_everything(cluster.metadata, name, lac)
    assert dict(seen) == everything
    assert read_everything(cluster.metadata, name, lac) == seen
    info = client.stream_info(name)
    # Term 1 wrote nothing (term 2 took over before its first entry, both starting at 0): the
    # bounded history drops it, as any term wholly below the first retained entry.
    assert [term for term, _ in info.term_history] == list(range(2, 3 + ROUNDS))
    noops = noop_ids(cluster, info, lac)
    assert noops == {first for _, first in info.term_history}
    assert len(noops) + len(everything) == lac + 1  # no gap
    assert_bookies_agree(cluster, info, lac)


# ---------------------------------------------------------------------- streamctl info


def table_rows(text: str) -> list[list[str]]:
    """Returns the cells of every table row in rich's output `text`."""
    return [
        [cell.strip() for cell in line.strip().strip("│").split("│")]
        for line in text.splitlines()
        if line.strip().startswith("│")
    ]


def test_streamctl_info_shows_term_state_lac_fragments_and_term_history(
    client: StreamClient, cluster: SandboxCluster
) -> None:
    name = "history"
    client.create_stream(name)
    with client.open_writer(name) as first:  # term 1: entries 0..9
        for i in range(10):
            first.append_async(b"one-%d" % i)
    with client.open_writer(name) as second:  # term 2: no-op at 10, entries 11..15
        for i in range(5):
            second.append_async(b"two-%d" % i)
    client.open_writer(name).close()  # term 3: no-op at 16
    shown = streamctl(cluster.metadata, "info", name)
    assert shown.returncode == 0, shown.stderr
    summary, rest = shown.stdout.split("fragments", 1)
    fragments, history = rest.split("term history", 1)
    summary_rows = table_rows(summary)
    for row in (["term", "3"], ["state", "OPEN"], ["LAC", "16"], ["first entry", "0"]):
        assert row in summary_rows, shown.stdout
    ensemble = client.stream_info(name).fragments[0].ensemble
    assert table_rows(fragments) == [["0", "open", ", ".join(ensemble), "-"]], shown.stdout
    assert table_rows(history) == [["1", "0"], ["2", "10"], ["3", "16"]], shown.stdout
