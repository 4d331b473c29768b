"""BP-46 cookies on real processes: a bookie whose data directory was wiped refuses to start
(auto_fix_cookie = false) with a message naming `streamctl bookie fix-cookie`; that command
refuses while the bookie runs, otherwise runs phase one and rewrites the cookie; the bookie then
starts, repairs itself from its peers (phase two) and leaves limbo."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from stream.client import StreamClient
from stream.metadata.bookies import BookieRegistry
from stream.sandbox.bookies import BookieProcess
from stream.sandbox.ports import free_port
from stream.wire import bookie_pb2 as pb
from tests.integration.conftest import ClusterFactory
from tests.integration.replication_support import session_of

pytestmark = pytest.mark.integration

ENTRIES = 500


def fix_cookie(
    bookie: BookieProcess, config: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs `streamctl bookie fix-cookie --config <the bookie's config>`."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "stream.cli.main",
            "bookie",
            "fix-cookie",
            "--config",
            str(config or bookie.config_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def held_entries(bookie: BookieProcess, stream_id: int, last: int) -> dict[int, bytes]:
    request = pb.ReadRangeRequest(stream_id=stream_id, first_entry_id=0, last_entry_id=last)
    return {
        e.entry_id: e.payload
        for r in bookie.stub().ReadRange(request, timeout=30)
        for e in r.entries
    }


def test_wiped_bookie_refuses_then_fix_cookie_rebuilds_it(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(3, journal_write_data=False, flush_interval_ms=100)
    with StreamClient.connect(cluster.metadata) as client:
        client.create_stream("kept", ensemble=3, write_quorum=3, ack_quorum=2)
        with client.open_writer("kept") as writer:
            for i in range(ENTRIES):
                writer.append_async(f"kept-{i}".encode())
            writer.flush()
        info = client.stream_info("kept")
    victim = cluster.bookie("bookie-3")
    assert fix_cookie(victim).returncode == 1  # refuses while the bookie runs
    assert victim.terminate() == 0
    shutil.rmtree(victim.data_dir / "data")

    victim.start()
    assert victim.wait_exit(60) == 1
    tail = victim.log_tail(5)
    assert "has no cookie" in tail
    assert "streamctl bookie fix-cookie" in tail

    fixed = fix_cookie(victim)
    assert fixed.returncode == 0, fixed.stderr
    assert "1 open streams term-fenced and put in limbo" in fixed.stdout
    again = fix_cookie(victim)
    assert again.returncode == 0 and "nothing to fix" in again.stdout

    victim.start()
    victim.wait_ready(60)
    request = pb.StreamStateRequest(stream_id=info.stream_id)
    deadline = time.monotonic() + 60
    while (state := victim.stub().StreamState(request, timeout=10)).limbo:
        assert time.monotonic() < deadline, victim.log_tail(20)
        time.sleep(0.05)
    assert state.term > info.term  # phase two took the stream over to fix its end
    held = held_entries(victim, info.stream_id, ENTRIES - 1)
    assert held == {i: f"kept-{i}".encode() for i in range(ENTRIES)}


def test_fix_cookie_refuses_a_bookie_registered_as_available(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    # Its listen address is free here (a config naming another port, as for a bookie running
    # on another host or interface): only the registration shows the bookie runs.
    cluster = cluster_factory(3)
    victim = cluster.bookie("bookie-2")
    with session_of(cluster) as session:
        registry = BookieRegistry(session)
        cookie = registry.read_cookie("bookie-2")
        text = victim.config_path.read_text()
        listen = tomllib.loads(text)["listen"]
        elsewhere = tmp_path / "bookie.toml"
        elsewhere.write_text(text.replace(listen, f"127.0.0.1:{free_port()}"))
        refused = fix_cookie(victim, elsewhere)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "bookie-2 is registered as available" in refused.stdout + refused.stderr
        assert registry.read_cookie("bookie-2") == cookie  # nothing changed
    assert victim.running
