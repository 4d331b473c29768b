"""Durable cursors on real ZooKeeper and bookie processes: commits bounded by the LAC, resets,
lag in entries and bytes, `tail(cursor=...)` resuming after the committed position, and a
consumer killed with SIGKILL over and over while a producer appends: nothing skipped,
duplicates only after the last commit."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from stream.client import StreamClient
from stream.errors import CursorRegressionError, EntryNotWrittenError, InvalidArgumentError
from stream.sandbox.cluster import SandboxCluster
from tests.integration.cli_support import streamctl
from tests.integration.retention_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def client(cluster: SandboxCluster) -> Iterator[StreamClient]:
    c = StreamClient.connect(cluster.metadata)
    try:
        yield c
    finally:
        c.close()


def append(client: StreamClient, name: str, count: int, size: int = 100) -> None:
    with client.open_writer(name) as writer:
        for _ in range(count):
            writer.append_async(b"x" * size)
        writer.flush()


def test_commit_reset_and_lag(client: StreamClient) -> None:
    client.create_stream("s", fragment_max_entries=10)
    append(client, "s", 35)  # 30 entries in three closed fragments, 5 in the open one
    cursor = client.cursor("s", "billing")
    assert cursor.position is None
    lac = client.open_reader("s").last_add_confirmed()
    with pytest.raises(EntryNotWrittenError):
        cursor.commit(lac + 1)
    assert cursor.position is None
    cursor.commit(14)
    with pytest.raises(CursorRegressionError):
        cursor.commit(13)
    lag = cursor.lag
    assert (lag.position, lag.lac, lag.entries) == (14, lac, lac - 14)
    # Closed fragments count their recorded bytes (about 100 per entry), the open one the
    # average of those.
    assert lag.bytes is not None and abs(lag.bytes - 100 * lag.entries) <= 10 * lag.entries
    assert client.cursor("s", "other").reset("earliest") == -1
    assert cursor.reset("latest") == lac and cursor.lag.entries == 0
    assert cursor.reset(3) == 2 and cursor.position == 2
    with pytest.raises(InvalidArgumentError):
        cursor.reset("soon")
    info = client.stream_info("s")
    assert {n: lag.entries for n, lag in info.cursors.items()} == {
        "billing": lac - 2,
        "other": lac + 1,
    }
    # A brief answer (a query planner's) has the same bounds, without the cursors, the
    # writer and the bookies' states.
    brief = client.stream_info("s", brief=True)
    assert info.bookies and brief.bookies == [] and brief.cursors == {}
    assert brief.writer is None
    assert brief == dataclasses.replace(info, cursors={}, bookies=[], writer=None)


def test_tail_resumes_after_the_commit_and_commits_what_was_handled(
    client: StreamClient,
) -> None:
    client.create_stream("t", fragment_max_entries=50)
    append(client, "t", 120)
    cursor = client.cursor("t", "c")
    seen = []
    for entry in client.open_reader("t").tail(cursor=cursor, timeout_s=5):
        seen.append(entry.entry_id)
        if entry.entry_id == 40:
            break
    # Entry 40 was handed out but the application never came back for the next one.
    assert seen == list(range(41)) and cursor.position == 39
    rest = [e.entry_id for e in client.open_reader("t").tail(cursor=cursor, timeout_s=0.5)]
    assert rest == list(range(40, 120)) and cursor.position == 119
    with pytest.raises(InvalidArgumentError):
        client.open_reader("t").tail(cursor=cursor, auto_commit_interval_s=0)


def read_runs(out: Path) -> list[tuple[int | None, list[int]]]:
    """Returns each consumer run's starting position and the entry ids it processed."""
    runs: list[tuple[int | None, list[int]]] = []
    for line in out.read_text().splitlines():
        if line.startswith("start "):
            value = line.split()[1]
            runs.append((None if value == "None" else int(value), []))
        elif line:
            runs[-1][1].append(int(line))
    return runs


def start_consumer(metadata: str, out: Path, idle_s: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.cursor_consumer",
            metadata,
            "c",
            "app",
            str(out),
            str(idle_s),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def progressed(out: Path, lines: int, consumer: subprocess.Popen[bytes]) -> bool:
    """Returns whether `out` has `lines` lines (or the consumer exited)."""
    return len(out.read_text().splitlines()) >= lines or consumer.poll() is not None


def test_a_consumer_killed_again_and_again_skips_nothing(
    cluster: SandboxCluster, client: StreamClient, tmp_path: Path
) -> None:
    total, kills = 4000, 10
    client.create_stream("c", fragment_max_entries=500)
    out = tmp_path / "consumed.txt"
    out.touch()

    def produce() -> None:
        with client.open_writer("c") as writer:
            for i in range(total):
                writer.append(f"{i}".encode())

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        for _ in range(kills):
            before = len(out.read_text().splitlines())
            consumer = start_consumer(cluster.metadata, out, 60)
            try:
                # Killed once it has processed a few hundred more entries, mid-stream.
                wait_until(
                    partial(progressed, out, before + 300, consumer),
                    what="the consumer to make progress",
                )
            finally:
                consumer.send_signal(signal.SIGKILL)
                consumer.wait()
    finally:
        producer.join()
    consumer = start_consumer(cluster.metadata, out, 2)
    _, errors = consumer.communicate(timeout=120)
    assert consumer.returncode == 0, errors.decode()

    runs = read_runs(out)
    assert len(runs) == kills + 1
    processed: set[int] = set()
    highest = -1
    for position, ids in runs:
        # The cursor never holds an entry the previous runs did not process...
        assert (position if position is not None else -1) <= highest
        # ...each run starts right after it, and reads on without a gap.
        first = 0 if position is None else position + 1
        assert ids == list(range(first, first + len(ids)))
        # Duplicates: only the entries after the last commit.
        assert all(i > (position if position is not None else -1) for i in processed & set(ids))
        processed |= set(ids)
        highest = max(highest, *ids) if ids else highest
    assert processed == set(range(total))
    # Each restart resumed from a commit, further each time (not from the start again).
    starts = [position for position, _ in runs[1:]]
    assert None not in starts and starts == sorted(starts) and len(set(starts)) > kills // 2
    duplicates = sum(len(ids) for _, ids in runs) - total
    print(f"\n{kills} kills, {duplicates} entries processed twice")


def test_streamctl_cursors_list_show_reset_delete(
    cluster: SandboxCluster, client: StreamClient
) -> None:
    metadata = cluster.metadata
    client.create_stream("cli", fragment_max_entries=10)
    append(client, "cli", 25)
    client.cursor("cli", "a").commit(9)
    client.cursor("cli", "b").commit(19)

    listed = streamctl(metadata, "cursors", "list", "cli", "--output", "json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["cursor"]: r for r in json.loads(listed.stdout)}
    assert {n: (r["position"], r["entries"]) for n, r in rows.items()} == {
        "a": (9, 15),
        "b": (19, 5),
    }
    assert rows["a"]["bytes"] > rows["b"]["bytes"] > 0 and rows["a"]["committed_ms"] > 0
    table = streamctl(metadata, "cursors", "list", "cli")
    assert table.returncode == 0 and "lag entries" in table.stdout and "b" in table.stdout
    shown = streamctl(metadata, "cursors", "show", "cli", "b", "--output", "json")
    assert json.loads(shown.stdout)["position"] == 19

    # By time: the first entry stamped at or after it is read next.
    reader = client.open_reader("cli")
    stamp_ms = next(iter(reader.read(12, 12))).timestamp_ms
    iso = datetime.datetime.fromtimestamp(stamp_ms / 1000, datetime.UTC).isoformat()
    at_time = streamctl(metadata, "cursors", "reset", "cli", "b", "--to-time", iso)
    assert at_time.returncode == 0, at_time.stderr
    assert client.cursor("cli", "b").position == reader.seek_time(stamp_ms) - 1 <= 11
    an_hour = streamctl(metadata, "cursors", "reset", "cli", "b", "--to-time", "-1h")
    assert an_hour.returncode == 0, an_hour.stderr
    assert client.cursor("cli", "b").position == -1  # every entry is younger than an hour
    both = streamctl(metadata, "cursors", "reset", "cli", "b", "--to", "1", "--to-time", "-1h")
    assert both.returncode == 2

    for to, position in (("earliest", -1), ("latest", 24), ("7", 6)):
        reset = streamctl(metadata, "cursors", "reset", "cli", "b", "--to", to)
        assert reset.returncode == 0, reset.stderr
        assert client.cursor("cli", "b").position == position
    info = streamctl(metadata, "info", "cli", "--output", "json")
    assert json.loads(info.stdout)["cursors"]["b"]["entries"] == 18
    assert "cursors" in streamctl(metadata, "info", "cli").stdout

    deleted = streamctl(metadata, "cursors", "delete", "cli", "a")
    assert deleted.returncode == 0, deleted.stderr
    # Exit codes: not found 3, usage 2; a bad request changes nothing.
    assert streamctl(metadata, "cursors", "delete", "cli", "a").returncode == 3
    assert streamctl(metadata, "cursors", "show", "cli", "a").returncode == 3
    assert streamctl(metadata, "cursors", "list", "nope").returncode == 3
    assert streamctl(metadata, "cursors", "reset", "cli", "b", "--to", "soon").returncode == 2
    assert streamctl(metadata, "cursors", "reset", "cli", "b/c", "--to", "1").returncode == 2
    assert [n for n in client.cursors("cli")] == ["b"] and client.cursor("cli", "b").position == 6
