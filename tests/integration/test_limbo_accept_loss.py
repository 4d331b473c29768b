"""A stuck limbo on real processes (issue 14 item 4, docs/design.md §4): two journal-less bookies of
an E3 W3 A2 stream are killed together (SIGKILL) after their write caches were flushed, and come
back in limbo. No recovery can complete: the entry after the last one gets UNKNOWN from both
(limbo) and a single explicit negative, short of QC = 2. A takeover must fail with
`StreamInLimboError` naming them within its deadline (not hang), `streamctl recover --accept-loss
--yes` must end it, and then the stream is writable again with every flushed entry readable.

Exactly three bookies: every stream is placed on all of them. They also register their journal
mode, so an AQ = 1 stream cannot be placed on any of them.
"""

from __future__ import annotations

import json
import time

import pytest

from stream.client import StreamClient, WriterOptions
from stream.errors import InvalidTermError, NotEnoughBookiesError, StreamInLimboError
from stream.sandbox.cluster import SandboxCluster
from stream.wire import bookie_pb2 as pb
from tests.integration.cli_support import streamctl
from tests.integration.conftest import ClusterFactory

pytestmark = pytest.mark.integration

BOOKIE_SETTINGS = {
    "journal_write_data": False,
    "flush_interval_ms": 100,
    "metadata_session_timeout_ms": 4000,
}
ENTRIES = 200
TAKEOVER_DEADLINE_S = 10.0
# Failure bounds, not waits (a loaded 2-core machine runs four suites at once).
LIMBO_ERROR_BOUND_S = TAKEOVER_DEADLINE_S + 50.0
REPAIR_BOUND_S = 120.0
# A bookie's own repair (phase two) also runs takeovers of the stream; one that starts while
# ours runs fences ours (InvalidTermError): then ours is simply tried again.
ATTEMPTS = 4


def payload(i: int) -> bytes:
    return f"limbo-{i}".encode() * 4


def limbo_of(cluster: SandboxCluster, bookie_id: str, stream_id: int) -> bool:
    state = (
        cluster.bookie(bookie_id)
        .stub()
        .StreamState(pb.StreamStateRequest(stream_id=stream_id), timeout=10)
    )
    assert state.code == pb.OK, pb.Code.Name(state.code)
    return bool(state.limbo)


def test_aq1_stream_is_never_placed_on_journal_less_bookies(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(3, **BOOKIE_SETTINGS)
    options = WriterOptions(takeover_deadline_s=2.0)
    with StreamClient.connect(cluster.metadata, writer_options=options) as client:
        # Refused at creation already; and created anyway, the takeover refuses to place it.
        with pytest.raises(NotEnoughBookiesError, match="journal") as info:
            client.create_stream("aq1", ensemble=2, write_quorum=2, ack_quorum=1)
        assert info.value.context["journal_less"] == 3
        client.create_stream(
            "aq1", ensemble=2, write_quorum=2, ack_quorum=1, allow_fewer_bookies=True
        )
        with pytest.raises(NotEnoughBookiesError, match="journal") as info:
            client.open_writer("aq1")
        assert info.value.context["journal_less"] == 3
        # AQ = 2 on the same bookies is fine.
        client.create_stream("aq2", ensemble=3, write_quorum=3, ack_quorum=2)
        with client.open_writer("aq2") as writer:
            writer.append(b"x")


def test_limbo_stall_fails_clearly_and_accept_loss_ends_it(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(3, **BOOKIE_SETTINGS)
    name = "stuck"
    options = WriterOptions(takeover_deadline_s=TAKEOVER_DEADLINE_S)
    with StreamClient.connect(cluster.metadata, writer_options=options) as client:
        meta = client.create_stream(name, ensemble=3, write_quorum=3, ack_quorum=2)
        with client.open_writer(name) as writer:
            futures = [writer.append_async(payload(i)) for i in range(ENTRIES)]
            writer.flush()
            assert [f.result() for f in futures] == list(range(ENTRIES))
        # Ten flush intervals: every acknowledged entry is in the entry logs of all three.
        time.sleep(BOOKIE_SETTINGS["flush_interval_ms"] / 1000 * 10)
        victims = [b.bookie_id for b in cluster.bookies[:2]]
        for bookie_id in victims:
            cluster.bookie(bookie_id).kill9()
        for bookie_id in victims:
            cluster.bookie(bookie_id).start()
        for bookie_id in victims:
            cluster.bookie(bookie_id).wait_ready(60)
            assert limbo_of(cluster, bookie_id, meta.id)

        # 1. A takeover cannot complete: it fails, naming limbo and the two bookies.
        for _ in range(ATTEMPTS):
            started = time.monotonic()
            try:
                client.open_writer(name)
            except InvalidTermError:  # a bookie's own repair took over meanwhile
                continue
            except StreamInLimboError as e:
                took_s = time.monotonic() - started
                error = e
                break
            pytest.fail("a takeover completed although two bookies are in limbo")
        else:
            pytest.fail(f"no takeover ran alone in {ATTEMPTS} attempts")
        assert "limbo" in str(error) and "--accept-loss" in str(error)
        assert sorted(error.context["bookies"]) == sorted(victims)
        assert error.context["entry_id"] == ENTRIES
        assert TAKEOVER_DEADLINE_S * 0.5 <= took_s < LIMBO_ERROR_BOUND_S, took_s
        print(f"\ntakeover failed with StreamInLimboError after {took_s:.1f} s")

        # 2. Without --yes and without a terminal, nothing happens.
        refused = streamctl(cluster.metadata, "recover", name, "--accept-loss", stdin="yes\n")
        assert refused.returncode == 2, refused.stderr
        assert "--yes" in refused.stderr
        assert client.stream_info(name).accepted_losses == []

        # 3. recover --accept-loss --yes ends it.
        for _ in range(ATTEMPTS):
            done = streamctl(
                cluster.metadata, "recover", name, "--accept-loss", "--yes", "--output", "json"
            )
            if done.returncode == 0 or "another writer took over" not in done.stderr:
                break
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert sorted(report["survey"]["limbo_bookies"]) == sorted(victims)
        assert report["survey"]["first_at_risk"] == ENTRIES
        loss = report["accepted_loss"]
        assert loss["first_entry_id"] == ENTRIES and loss["last_entry_id"] >= ENTRIES
        assert sorted(loss["limbo_bookies"]) == sorted(victims)
        info = client.stream_info(name)
        assert info.state == "OPEN"
        (recorded,) = info.accepted_losses
        assert recorded.term == loss["term"] and recorded.operator == loss["operator"]
        assert abs(recorded.at_ms / 1000 - time.time()) < 600
        shown = streamctl(cluster.metadata, "info", name, columns=200)
        assert shown.returncode == 0, shown.stderr
        assert "given up by recover --accept-loss" in shown.stdout
        assert f"{ENTRIES}..{loss['last_entry_id']}" in shown.stdout

        # 4. Phase two clears the limbo now that a recovery fixed the end.
        started = time.monotonic()
        while any(limbo_of(cluster, b, meta.id) for b in victims):
            assert time.monotonic() - started < REPAIR_BOUND_S, "limbo did not clear"
            time.sleep(0.1)
        print(f"limbo cleared {time.monotonic() - started:.1f} s after the accept-loss recovery")

        # 5. Writable again, and every flushed entry is there.
        writer = None
        for _ in range(ATTEMPTS):
            try:
                writer = client.open_writer(name, options=WriterOptions())
                break
            except InvalidTermError:
                continue
        assert writer is not None
        with writer:
            after = writer.append(b"after the stall")
        info = client.stream_info(name)
        got = {e.entry_id: e.payload for e in client.open_reader(name).read(0, info.lac)}
        assert {i: got.get(i) for i in range(ENTRIES)} == {i: payload(i) for i in range(ENTRIES)}
        assert got[after] == b"after the stall"
        assert after > ENTRIES  # after the accept-loss recovery's truncate no-op
