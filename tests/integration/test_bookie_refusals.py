"""Bookies refuse what metadata cannot justify (docs/design.md §4), on real processes, with
nothing but the generated stubs (as an adversarial local user, or a buggy client, would):

- a `Fence` with term 2**64 - 1 on one bookie: refused (metadata never handed that term out),
  the bookie's term unchanged, and the stream keeps working (append, takeover, read, seal);
- an `Add` at the current term replacing an acknowledged entry (below the LAC) with other bytes
  and a correct checksum: refused by every bookie, the entry reads back unchanged;
- a `Trim` (it carries no term) on the open fragment, and one far beyond the last entry:
  refused, nothing deleted.

Each refusal is one `bookie.request_refused` log event naming the RPC, the stream, the reason
and the caller's address, and is counted. With the protections switched off (the test-only
`bookie start --unsafe-test-only-skip metadata_term_check,overwrite_check,trim_check`) the same
requests succeed: the forged entry is read, the trim deletes entries metadata still promises,
and the poisoned term fences the stream for good.
"""

from __future__ import annotations

import pytest

from stream.client import StreamClient
from stream.errors import InvalidTermError
from stream.sandbox.bookies import BookieProcess
from stream.sandbox.cluster import SandboxCluster
from stream.wire import bookie_pb2 as pb
from tests.integration.bookie_support import add_all, make_entry, metric_value, wait_until
from tests.integration.conftest import ClusterFactory
from tests.integration.retention_support import logged_events

pytestmark = pytest.mark.integration

POISON = (1 << 64) - 1
FAR_BEYOND = 1_000_000
REAL = [f"real-{i}".encode() for i in range(4)]


def state(bookie: BookieProcess, stream_id: int) -> pb.StreamStateResponse:
    return bookie.stub().StreamState(pb.StreamStateRequest(stream_id=stream_id), timeout=10)


def forged_add(bookie: BookieProcess, stream_id: int, term: int) -> pb.AddResponse:
    """Replaces entry 2 (acknowledged) with other bytes and a correct checksum."""
    request = pb.AddRequest(
        stream_id=stream_id, term=term, lac=3, lafr=3, entries=[make_entry(stream_id, 2, b"FORGED")]
    )
    (response,) = add_all(bookie.stub(), [request])
    return response


def trim(bookie: BookieProcess, stream_id: int, before: int) -> pb.TrimResponse:
    request = pb.TrimRequest(stream_id=stream_id, before_entry_id=before)
    return bookie.stub().Trim(request, timeout=10)


def read_all(client: StreamClient, name: str, last: int) -> list[bytes]:
    return [e.payload for e in client.open_reader(name).read(0, last)]


def refusals(bookie: BookieProcess, rpc: str) -> list[dict[str, object]]:
    return [e for e in logged_events(bookie.log_path, "bookie.request_refused") if e["rpc"] == rpc]


def start(cluster_factory: ClusterFactory, checks: str) -> SandboxCluster:
    off = ("metadata_term_check", "overwrite_check", "trim_check") if checks == "off" else ()
    return cluster_factory(3, unsafe_skips=off)


@pytest.mark.parametrize("checks", ["on", "off"])
def test_the_three_attacks_are_refused_and_the_stream_keeps_working(
    cluster_factory: ClusterFactory, checks: str
) -> None:
    cluster = start(cluster_factory, checks)
    bookies = cluster.bookies
    with StreamClient.connect(cluster.metadata) as client:
        client.create_stream("victim", ensemble=3, write_quorum=3, ack_quorum=2)
        client.create_stream("gone", ensemble=3, write_quorum=3, ack_quorum=2)
        with client.open_writer("gone") as writer:
            writer.append(b"gone-0")
        gone_id = client.stream_info("gone").stream_id
        client.delete_stream("gone")

        writer = client.open_writer("victim")
        for payload in REAL:
            writer.append(payload)
        stream_id = client.stream_info("victim").stream_id
        term = writer.term
        # The writer's explicit LAC after idling: entry 2 is below every bookie's LAC.
        wait_until(lambda: all(state(b, stream_id).lac >= 3 for b in bookies), what="LAC 3")

        # 1. The forged overwrite below the LAC, at the current term, on every bookie.
        forged = [forged_add(b, stream_id, term) for b in bookies]
        read_after_forgery = read_all(client, "victim", 3)
        # 2. Trims metadata does not justify: the open fragment, and far beyond the last entry.
        trims = [trim(b, stream_id, 2) for b in bookies]
        far_trims = [trim(b, stream_id, FAR_BEYOND) for b in bookies]
        # 3. The poisoned term on one bookie.
        poisoned = (
            bookies[0].stub().Fence(pb.FenceRequest(stream_id=stream_id, term=POISON), timeout=10)
        )

        if checks == "off":  # the attacks of the issue succeed
            assert all(list(r.codes) == [pb.OK] for r in forged), forged
            assert read_after_forgery == [REAL[0], REAL[1], b"FORGED", REAL[3]]
            assert all(r.code == pb.OK for r in trims + far_trims)
            assert client.stream_info("victim").first_entry_id == 0  # metadata promises 0
            assert state(bookies[1], stream_id).first_entry_id == FAR_BEYOND
            assert poisoned.code == pb.OK and state(bookies[0], stream_id).term == POISON
            writer.close()
            with pytest.raises(InvalidTermError):
                client.open_writer("victim")
            return

        for response in forged:
            assert list(response.codes) == [pb.BAD_REQUEST], response
            assert "at or below the LAC" in response.message
        assert read_after_forgery == REAL
        for response in trims + far_trims:
            assert response.code == pb.BAD_REQUEST, response
            assert response.first_entry_id == 0
            assert "beyond metadata's first retained entry 0" in response.message
        assert poisoned.code == pb.BAD_REQUEST, poisoned
        assert poisoned.bookie_term == term
        assert f"does not justify term {POISON}" in poisoned.message
        # Nothing changed: state and data read back the same.
        for bookie in bookies:
            after = state(bookie, stream_id)
            assert (after.term, after.first_entry_id, after.last_entry_id) == (term, 0, 3)
            read = bookie.stub().Read(pb.ReadRequest(stream_id=stream_id, entry_id=2), timeout=10)
            assert read.code == pb.OK and read.entry.payload == REAL[2]
        assert read_all(client, "victim", 3) == REAL

        # A poisoned term for a deleted stream: refused as deleted.
        gone = bookies[0].stub().Fence(pb.FenceRequest(stream_id=gone_id, term=POISON), timeout=10)
        assert gone.code == pb.NO_SUCH_STREAM, gone

        # Each refusal is one event naming the RPC, the stream, the reason and the caller.
        wait_until(lambda: len(refusals(bookies[0], "Fence")) == 2, what="Fence refusals logged")
        fence_event = refusals(bookies[0], "Fence")[0]
        assert fence_event["stream_id"] == stream_id
        assert fence_event["reason"] == "unjustified_term"
        assert str(fence_event["peer"]).startswith("ipv")
        for bookie in bookies:
            wait_until(lambda b=bookie: len(refusals(b, "Trim")) == 2, what="Trim refusals")
            (add_event,) = refusals(bookie, "Add")
            assert (add_event["stream_id"], add_event["reason"]) == (stream_id, "overwrite")
            assert metric_value(bookie, "streamkeeper_bookie_refused_total", rpc="Add") == 1
        assert (
            metric_value(
                bookies[0],
                "streamkeeper_bookie_refused_total",
                rpc="Fence",
                reason="unjustified_term",
            )
            == 1
        )

        # The stream keeps working: the writer appends, a takeover follows, then a seal.
        assert writer.append(b"real-4") == 4
        writer.close()
        with client.open_writer("victim") as second:
            assert second.term == term + 1
            fifth = second.append(b"real-5")
        assert read_all(client, "victim", fifth) == [*REAL, b"real-4", b"real-5"]
        client.seal_stream("victim")
        assert client.stream_info("victim").state == "SEALED"
        assert read_all(client, "victim", fifth) == [*REAL, b"real-4", b"real-5"]
