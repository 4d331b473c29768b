"""Consumption-aware retention on real processes (ZooKeeper, three bookies, `streamctl retention
run --metrics-listen`): a stalled cursor holds expired fragments back until `max_bytes`, then
the oldest go and its reader gets `EntryTrimmedError` (or skips); once the cursor moves on the
bookies' disks shrink; each cursor's lag is on the service's metrics endpoint."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream.client import RetentionPolicy, StreamClient, StreamInfo
from stream.errors import EntryTrimmedError
from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.ports import free_port
from stream.sandbox.retention import RetentionProcess
from tests.integration.cli_support import streamctl
from tests.integration.conftest import ClusterFactory
from tests.integration.retention_support import (
    MIB,
    SMALL_BOOKIE_SETTINGS,
    data_dirs,
    payload,
    wait_until,
)

pytestmark = pytest.mark.integration

ENTRY_BYTES = 64 << 10
BOOKIES = ("bookie-1", "bookie-2", "bookie-3")


@pytest.fixture
def service(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> Iterator[tuple[SandboxCluster, str]]:
    """A cluster whose bookies collect garbage quickly and a retention service (every 0.3 s)
    serving metrics; yields the cluster and the metrics URL."""
    cluster = cluster_factory(3, **SMALL_BOOKIE_SETTINGS)
    address = f"127.0.0.1:{free_port()}"
    retention = RetentionProcess(
        cluster.metadata, tmp_path / "retention.log", interval_s=0.3, metrics_listen=address
    ).start()
    try:
        yield cluster, f"http://{address}/metrics"
    finally:
        retention.stop()


def append(client: StreamClient, name: str, first: int, count: int) -> None:
    with client.open_writer(name) as writer:
        for i in range(first, first + count):
            writer.append_async(payload(i, ENTRY_BYTES))
        writer.flush()


def first_holding(client: StreamClient, name: str, entry_id: int) -> int:
    """Returns the first entry id of the fragment that holds `entry_id`."""
    return max(f.first_entry_id for f in client.stream_info(name).fragments
               if f.first_entry_id <= entry_id)  # fmt: skip


def lag_gauge(url: str, cursor: str) -> float | None:
    """Returns the `streamkeeper_cursor_lag_entries` of `cursor` on the metrics endpoint."""
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return None
    pattern = rf'^streamkeeper_cursor_lag_entries{{cursor="{cursor}",stream="kept"}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return None if found is None else float(found.group(1))


def test_a_stalled_cursor_holds_fragments_back_until_max_bytes(
    service: tuple[SandboxCluster, str],
) -> None:
    cluster, metrics_url = service
    with StreamClient.connect(cluster.metadata) as client:
        client.create_stream("kept", fragment_max_bytes=MIB)
        append(client, "kept", 0, 48)
        stalled = client.cursor("kept", "slow")
        stalled.commit(40)
        append(client, "kept", 48, 112)  # 160 entries: 10 MiB
        # Everything closed is past a 1 s age limit at once; 12 MiB leaves room.
        policy = RetentionPolicy(max_age_s=1, max_bytes=12 * MIB, keep_unconsumed=True)
        client.set_retention("kept", policy)

        # Age drops what the cursor consumed, and not one fragment more.
        held_from = first_holding(client, "kept", 41)
        wait_until(lambda: client.stream_info("kept").first_entry_id == held_from,
                   what="the consumed fragments to go")  # fmt: skip
        shown = streamctl(cluster.metadata, "retention", "show", "kept", "--output", "json")
        report = json.loads(shown.stdout)
        assert report["keep_unconsumed"] and report["fragments_held_by_cursors"] > 0
        assert report["cursors"]["slow"]["held_bytes"] >= 4 * MIB
        text = streamctl(cluster.metadata, "retention", "show", "kept").stdout
        assert "cursor slow (at 40)" in text

        # The lag gauge: the LAC less the position, as the client counts it. The service's
        # takeover of the idle stream (its open fragment is past the age limit) may add a
        # no-op at any moment, so the LAC is read on both sides and the gauge is compared with
        # the lag of its own moment (seen once: a lag of 120 against a LAC of 161 read after).
        def lac() -> int:
            return client.open_reader("kept").last_add_confirmed()

        def lag() -> int:
            return client.cursors("kept")["slow"].entries

        before = lac()
        counted = lag()
        assert before - 40 <= counted <= lac() - 40
        wait_until(lambda: lag_gauge(metrics_url, "slow") == lag(), what="the lag gauge")
        # A consumer of the stalled cursor still reads on from where it stopped.
        reader = client.open_reader("kept")
        tail = reader.tail(cursor=stalled, timeout_s=30)
        assert next(tail).entry_id == 41
        tail.close()
        assert client.stream_info("kept").first_entry_id == held_from

        # Past max_bytes the oldest go anyway: the stalled cursor's reader is overtaken.
        append(client, "kept", 160, 240)  # 400 entries: 25 MiB

        def overruled() -> StreamInfo | None:
            info = client.stream_info("kept")
            closed = sum(f.bytes or 0 for f in info.fragments[:-1])
            return info if info.first_entry_id > 41 and closed <= 12 * MIB else None

        info = wait_until(overruled, what="max_bytes to overrule the cursor")
        with pytest.raises(EntryTrimmedError) as trimmed:
            next(client.open_reader("kept").tail(cursor=stalled, timeout_s=5))
        assert trimmed.value.context["first_entry_id"] == info.first_entry_id
        assert stalled.position == 40  # nothing was committed by the failed read
        skipped = client.open_reader("kept").tail(cursor=stalled, timeout_s=5, on_trimmed="skip")
        assert next(skipped).entry_id == info.first_entry_id
        skipped.close()

        # Once the cursor moves on, age drops everything but the open fragment, and the
        # bookies' disks shrink to about that.
        held = wait_until(
            lambda: (
                all(data_dirs(cluster, b)["ledgers"] >= 10 * MIB for b in BOOKIES)
                and {b: data_dirs(cluster, b)["ledgers"] for b in BOOKIES}
            ),
            what="the held entries on the bookies' disks",
        )
        stalled.commit(399)
        last_first = client.stream_info("kept").fragments[-1].first_entry_id
        wait_until(lambda: client.stream_info("kept").first_entry_id == last_first,
                   what="the consumed fragments to go")  # fmt: skip
        retained = (400 - last_first) * ENTRY_BYTES
        shrunk = wait_until(
            lambda: (
                all(data_dirs(cluster, b)["ledgers"] <= retained + 4 * MIB for b in BOOKIES)
                and {b: data_dirs(cluster, b)["ledgers"] for b in BOOKIES}
            ),
            timeout_s=60,
            what="the bookies' disks to shrink",
        )
        print("\nentry logs while the cursor held", held, "after it moved on", shrunk)
        # The gauge follows: only the no-ops of the service's idle takeovers are left.
        wait_until(
            lambda: lag_gauge(metrics_url, "slow") == client.cursors("kept")["slow"].entries < 10,
            what="the lag gauge to follow the cursor",
        )
