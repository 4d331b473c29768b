"""The bookie's data port (Add streams, range reads and ReadLac framed over TCP,
stream.wire.frames) on real bookie processes: writers and readers told to use it do, over gRPC
otherwise or when a bookie has none, and whatever else arrives on the port is refused with its
reason and changes nothing."""

from __future__ import annotations

import json

import pytest

from stream.client import ReaderOptions, StreamClient, StreamWriter, WriterOptions
from stream.sandbox.cluster import SandboxCluster
from stream.wire import bookie_pb2 as pb
from stream.wire import frames
from tests.integration.bookie_support import add_request, metric_value
from tests.integration.conftest import ClusterFactory
from tests.integration.data_port_support import RawDataPort, data_address

pytestmark = pytest.mark.integration

CONNECTIONS = "streamkeeper_bookie_data_port_connections_total"


def connections(cluster: SandboxCluster, outcome: str) -> float:
    return sum(metric_value(b, CONNECTIONS, outcome=outcome) for b in cluster.bookies)


def connect(cluster: SandboxCluster, adds: bool, reads: bool) -> StreamClient:
    """A client whose writers (`adds`) and readers (`reads`) use the data port by default."""
    return StreamClient.connect(
        cluster.metadata,
        writer_options=WriterOptions(data_port=adds),
        reader_options=ReaderOptions(data_port=reads),
    )


def append_all(writer: StreamWriter, payloads: list[bytes]) -> None:
    for f in [writer.append_async(p) for p in payloads]:
        f.result(timeout=30)


@pytest.mark.shared_cluster
def test_writers_and_readers_use_the_data_port_unless_told_not_to(
    cluster: SandboxCluster,
) -> None:
    assert all(data_address(b) for b in cluster.bookies)
    payloads = [f"entry-{i}".encode() * 20 for i in range(3000)]
    for adds, reads in ((True, True), (True, False), (False, True), (False, False)):
        name = f"framed-{adds}-{reads}"
        before = connections(cluster, "served")
        with connect(cluster, adds, reads) as client:
            client.create_stream(name, ensemble=3, write_quorum=3, ack_quorum=2)
            with client.open_writer(name) as writer:
                append_all(writer, payloads)
            read = [e.payload for e in client.open_reader(name).read(0, len(payloads) - 1)]
        assert read == payloads
        # One Add stream per bookie of the ensemble, and a read connection to each: the LAC
        # asked of each over its data port, the range read over one of them (idle by then).
        assert connections(cluster, "served") - before == 3 * adds + 3 * reads, (adds, reads)


@pytest.mark.shared_cluster
@pytest.mark.parametrize("client_default", [True, False])
def test_a_writer_and_a_reader_opened_with_options_follow_their_own(
    cluster: SandboxCluster, client_default: bool
) -> None:
    """The options a writer or a reader is opened with decide its data port use, whatever the
    client's (which those opened without options follow)."""
    payloads = [f"own-{i}".encode() * 20 for i in range(1000)]
    own = not client_default
    name = f"own-options-{own}"
    with connect(cluster, client_default, client_default) as client:
        client.create_stream(name, ensemble=3, write_quorum=3, ack_quorum=2)
        before = connections(cluster, "served")
        with client.open_writer(name, options=WriterOptions(data_port=own)) as writer:
            append_all(writer, payloads)
        reader = client.open_reader(name, options=ReaderOptions(data_port=own))
        assert [e.payload for e in reader.read(0, len(payloads) - 1)] == payloads
        assert connections(cluster, "served") - before == 6 * own
        # A tail's long polls for the LAC follow them too: a reader told not to use the data
        # port asks over gRPC even when the client's default is the data port.
        assert list(reader.tail("latest", timeout_s=0.5)) == []
        if not own:
            assert connections(cluster, "served") == before
        before = connections(cluster, "served")
        default_reader = client.open_reader(name)
        assert [e.payload for e in default_reader.read(0, len(payloads) - 1)] == payloads
        assert connections(cluster, "served") - before == 3 * client_default


def test_a_bookie_without_a_data_port_is_added_to_over_grpc(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(3, data_listen="")
    assert [data_address(b) for b in cluster.bookies] == ["", "", ""]
    with StreamClient.connect(cluster.metadata) as client:
        client.create_stream("plain", ensemble=3, write_quorum=3, ack_quorum=2)
        with client.open_writer("plain") as writer:
            ids = [writer.append(f"p{i}".encode()) for i in range(50)]
        read = [e.payload for e in client.open_reader("plain").read(0, 49)]
    assert ids == list(range(50))
    assert read == [f"p{i}".encode() for i in range(50)]


@pytest.mark.shared_cluster
def test_the_data_port_refuses_what_is_not_an_add_stream(cluster: SandboxCluster) -> None:
    bookie = cluster.bookies[0]
    address = data_address(bookie)
    refused = connections(cluster, "refused")

    def refusal(port: RawDataPort) -> str:
        reason = port.answer()
        assert isinstance(reason, str), reason
        assert port.answer() is None  # and the bookie closed the connection
        port.close()
        return reason

    http = RawDataPort(address)
    http.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert "not a data port client" in refusal(http)

    elsewhere = RawDataPort(address).hello("bookie-9")
    assert refusal(elsewhere) == f"this is bookie {bookie.bookie_id}, not bookie-9"

    huge = RawDataPort(address).hello(bookie.bookie_id)
    huge.send(frames.length_prefix(1 << 31))
    assert "a frame of 2147483648 bytes is over this bookie's limit" in refusal(huge)

    # A request that does not parse is answered BAD_REQUEST and the stream goes on, as on
    # gRPC's Add; a stream that no metadata holds is refused, with nothing stored.
    stream = RawDataPort(address).hello(bookie.bookie_id)
    stream.frame(b"\xff\xff\xff garbage")
    malformed = stream.answer()
    assert isinstance(malformed, pb.AddResponse)
    assert list(malformed.codes) == [pb.BAD_REQUEST]
    assert "malformed AddRequest" in malformed.message
    stream.add(add_request(987_654, 1, range(3)))
    unjustified = stream.answer()
    assert isinstance(unjustified, pb.AddResponse)
    assert pb.OK not in unjustified.codes
    # A frame cut short by the writer's end: the bookie drops the connection.
    stream.send(frames.length_prefix(100) + b"short")
    stream.sock.shutdown(1)
    assert stream.answer() is None
    stream.close()

    # Refused before admission: the stranger and the wrong bookie id (the others were streams).
    assert connections(cluster, "refused") - refused == 2
    state = bookie.stub().StreamState(pb.StreamStateRequest(stream_id=987_654), timeout=10)
    assert state.code == pb.NO_SUCH_STREAM
    failures = [
        json.loads(line)
        for line in bookie.log_path.read_text().splitlines()
        if '"data_port.connection_failed"' in line
    ]
    assert failures == []
    # The bookie serves on: a writer adds through its data port.
    with StreamClient.connect(cluster.metadata) as client:
        client.create_stream("after-garbage", ensemble=3, write_quorum=3, ack_quorum=3)
        with client.open_writer("after-garbage") as writer:
            assert writer.append(b"fine") == 0


@pytest.mark.shared_cluster
def test_large_answers_are_received_and_walked_into_reused_buffers(
    cluster: SandboxCluster,
) -> None:
    # Answers of 2.5 MiB (past `answer_buffers`' threshold): after a read, the client keeps
    # the buffers it received them in and the reader those of its payload columns, and a
    # second read of the same entries, into the same buffers, returns them unchanged while
    # the first read's columns are still held.
    payloads = [bytes([i % 251]) * 1024 for i in range(8000)]
    with connect(cluster, True, True) as client:
        client.create_stream("reused-buffers", fragment_max_entries=100_000)
        with client.open_writer("reused-buffers") as writer:
            append_all(writer, payloads)
        reader = client.open_reader(
            "reused-buffers", options=ReaderOptions(range_batch_bytes=5 << 19)
        )
        first = list(reader.read_columns(0, len(payloads) - 1))
        second = list(reader.read_columns(0, len(payloads) - 1))
        assert [p for c in second for p in c.payloads] == payloads
        assert [p for c in first for p in c.payloads] == payloads
        core = reader._core
        assert core._columns._kept
        assert core._transport._reads._buffers._kept  # type: ignore[attr-defined]
