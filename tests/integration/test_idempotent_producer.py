"""Idempotent producers on real ZooKeeper and bookie processes: a producer reopened after its
writer went away knows its last sequence, its re-sent appends are dropped and answer the ids
already written; rolls, plain takeovers and other producers keep every producer's position
in the producer table; gaps, steps back and unnumbered appends are refused; a producer process
killed with SIGKILL (after acknowledgments, or with appends in flight) and re-run from its
start writes every record exactly once, in order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stream.client import StreamClient
from stream.errors import InvalidArgumentError
from stream.protocol.producers import EPOCH_BITS, UNKNOWN_ENTRY_ID
from stream.sandbox.cluster import SandboxCluster

pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]


def payloads(client: StreamClient, name: str) -> list[bytes]:
    reader = client.open_reader(name)
    lac = client.stream_info(name).lac
    return [e.payload for e in reader.read(0, lac)] if lac >= 0 else []


def test_reopened_producer_drops_what_it_wrote(client: StreamClient) -> None:
    client.create_stream("p", ensemble=3, write_quorum=2, ack_quorum=2)
    with client.open_writer("p", producer_id="p1") as writer:
        assert writer.last_sequence == -1
        ids = [writer.append(b"r%d" % n, sequence=n) for n in range(5)]
    with client.open_writer("p", producer_id="p1") as writer:
        assert writer.last_sequence == 4
        # Re-run from the start: the first five are dropped and answer their ids.
        again = [writer.append(b"r%d" % n, sequence=n) for n in range(8)]
        assert again[:5] == ids
        assert writer.last_sequence == 7
    assert payloads(client, "p") == [b"r%d" % n for n in range(8)]


def test_refused_appends_write_nothing(client: StreamClient) -> None:
    client.create_stream("q", ensemble=3, write_quorum=3, ack_quorum=2)
    with client.open_writer("q", producer_id="p1") as writer:
        writer.append(b"a", sequence=0)
        for bad in ({"sequence": 2}, {"sequence": 0}, {}):
            with pytest.raises(InvalidArgumentError):
                writer.append(b"x", **bad)  # type: ignore[arg-type]
        writer.append(b"b", sequence=1)
        # A new epoch may start at its first position.
        writer.append(b"c", sequence=1 << EPOCH_BITS)
    with client.open_writer("q") as plain:
        with pytest.raises(InvalidArgumentError):
            plain.append(b"x", sequence=3)
        with pytest.raises(InvalidArgumentError):
            _ = plain.last_sequence
    assert payloads(client, "q") == [b"a", b"b", b"c"]


def test_positions_survive_rolls_plain_takeovers_and_other_producers(
    client: StreamClient,
) -> None:
    client.create_stream("r", ensemble=3, write_quorum=3, ack_quorum=2, fragment_max_entries=4)
    with client.open_writer("r", producer_id="a") as writer:
        for n in range(10):  # two rolls
            writer.append(b"a%d" % n, sequence=n)
    info = client.stream_info("r")
    assert len(info.fragments) >= 3
    with client.open_writer("r") as plain:  # folds "a" into the table, ends its term
        plain.append(b"plain")
    with client.open_writer("r", producer_id="b") as writer:
        assert writer.last_sequence == -1
        writer.append(b"b0", sequence=0)
    with client.open_writer("r", producer_id="a") as writer:
        assert writer.last_sequence == 9
        # The table knows the id of the last sequence only; older ones are not kept.
        assert writer.append(b"a9", sequence=9) == 9
        writer2_ids = [writer.append(b"a%d" % n, sequence=n) for n in (10, 11)]
    assert writer2_ids[0] > 9
    with client.open_writer("r", producer_id="a") as writer:
        assert writer.last_sequence == 11
        # That term was "a"'s own: its run tells older ids too; before it, not.
        assert writer.append(b"a9", sequence=9) == UNKNOWN_ENTRY_ID
        assert writer.append(b"a10", sequence=10) == writer2_ids[0]
        assert writer.append(b"a11", sequence=11) == writer2_ids[1]
    assert payloads(client, "r") == [b"a%d" % n for n in range(10)] + [b"plain", b"b0"] + [
        b"a10",
        b"a11",
    ]


REPO = Path(__file__).resolve().parents[2]


def start_producer(
    metadata: str, stream: str, total: int, out: Path, mode: str, kill_at: int = -1
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.idempotent_producer",
            metadata,
            stream,
            "crashy",
            str(total),
            str(out),
            mode,
            str(kill_at),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def runs_of(out: Path) -> list[tuple[int, list[int], int]]:
    """Returns each run's `(last_sequence at start, acknowledged records, records sent)`."""
    runs: list[tuple[int, list[int], int]] = []
    for line in out.read_text().splitlines():
        words = line.split()
        if words and words[0] == "last":
            runs.append((int(words[1]), [], 0))
        elif words and words[0] == "ack":
            runs[-1][1].append(int(words[1]))
        elif words and words[0] == "sent":
            last, acked, sent = runs[-1]
            runs[-1] = (last, acked, sent + 1)
    return runs


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_producer_killed_and_rerun_from_its_start_writes_each_record_once(
    cluster: SandboxCluster, client: StreamClient, tmp_path: Path, mode: str
) -> None:
    """Each producer run but the last kills itself at a record further on than the last run:
    `sync` after that record is acknowledged; `async` once it is queued, with appends in
    flight between their send and their acknowledgment. Each run starts again at
    record 0 with the same producer id and sequences."""
    total, kills = 3000, 4
    stream = f"crash-{mode}"
    client.create_stream(stream, ensemble=3, write_quorum=3, ack_quorum=2, fragment_max_entries=700)
    out = tmp_path / "producer.txt"
    out.touch()
    for run in range(kills):
        # Each run dies further on than the last: at record 600, 1200, 1800, 2400.
        producer = start_producer(cluster.metadata, stream, total, out, mode, 600 * (run + 1))
        _, errors = producer.communicate(timeout=300)
        assert producer.returncode == -signal.SIGKILL, errors.decode()
    producer = start_producer(cluster.metadata, stream, total, out, mode)
    _, errors = producer.communicate(timeout=300)
    assert producer.returncode == 0, errors.decode()

    runs = runs_of(out)
    assert len(runs) == kills + 1
    acked_before = -1
    for last, acked, _ in runs:
        # What a run saw acknowledged is durable: the next run's takeover knows it.
        assert last >= acked_before
        acked_before = max([acked_before, *acked])
    # Every run but the last died mid-stream, with some records durable (the next run's
    # takeover finds a position short of the end) and, in async, as a rule others in flight.
    assert runs[0][0] == -1 and all(0 <= last < total - 1 for last, _, _ in runs[1:])
    assert payloads(client, stream) == [b"record-%d" % n for n in range(total)]
    summary = [(last, len(acked), sent) for last, acked, sent in runs]
    print(f"\n{mode}: runs (last_sequence at start, acknowledged, sent): {summary}")
