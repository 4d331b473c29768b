"""Mutual TLS and roles on real bookie processes (docs/security.md): certificates made by
`streamctl certs`' code, callers without a certificate refused, each role refused what is
beyond it with nothing changed and an audit line, the client end to end over TLS (a takeover
included), and certificate rotation by SIGHUP under a running writer."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from stream.cli.main import main
from stream.client import ReaderOptions, StreamClient, WriterOptions
from stream.sandbox.bookies import BookieProcess
from stream.sandbox.cluster import SandboxCluster
from stream.sandbox.zookeeper import ZooKeeperServer
from stream.security.certs import issue
from stream.security.roles import Role
from stream.security.tls import InsecureFileError, TLSConfig, sync_channel
from stream.wire import bookie_pb2 as pb
from stream.wire import bookie_pb2_grpc, frames
from tests.integration.bookie_support import (
    METADATA_UNCHECKED,
    add_all,
    add_request,
    make_entry,
    wait_until,
)
from tests.integration.conftest import running_cluster
from tests.integration.data_port_support import RawDataPort, data_address

pytestmark = pytest.mark.integration

STREAM_ID = 77


@pytest.fixture(scope="module")
def secure(
    zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandboxCluster]:
    """Three bookies serving mutual TLS with roles (no auto-recovery). The role tests send raw
    requests for stream STREAM_ID, which no metadata holds: these bookies do not check terms
    and trims against metadata (test_the_attacks_with_a_writer_certificate_are_refused
    does)."""
    cluster = running_cluster(
        zookeeper,
        tmp_path_factory.mktemp("secure"),
        secure=True,
        unsafe_skips=METADATA_UNCHECKED,
    )
    started = cluster.__enter__()
    try:
        yield started
    finally:
        cluster.__exit__(None, None, None)


def stub_as(cluster: SandboxCluster, role: Role | None, bookie: int = 0) -> Any:
    """Returns a stub to one bookie holding `role`'s certificate (None: the CA only)."""
    assert cluster.tls is not None
    files = TLSConfig(str(cluster.tls.ca_file)) if role is None else cluster.tls.client(role)
    channel = sync_channel(cluster.bookies[bookie].address, files)
    return bookie_pb2_grpc.BookieStub(channel)


def snapshot(stub: Any, stream_id: int) -> tuple[bytes, list[bytes]]:
    """The bookie's state of the stream and every entry it holds, serialized."""
    state = stub.StreamState(pb.StreamStateRequest(stream_id=stream_id), timeout=10)
    ranges = stub.ReadRange(
        pb.ReadRangeRequest(stream_id=stream_id, first_entry_id=0, last_entry_id=1000),
        timeout=10,
    )
    entries = [e.SerializeToString() for r in ranges for e in r.entries]
    return state.SerializeToString(), entries


def denied(call: Any, rpc: str, principal: str) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert rpc in raised.value.details() and principal in raised.value.details()


def audit_events(bookie: BookieProcess) -> list[dict[str, Any]]:
    events = []
    for line in bookie.log_path.read_text().splitlines():
        if '"bookie.audit"' in line:
            events.append(json.loads(line))
    return events


def audit_count(bookie: BookieProcess, action: str, principal: str) -> float:
    with urllib.request.urlopen(f"http://{bookie.metrics_address}/metrics", timeout=10) as r:
        text = r.read().decode()
    want = f'streamkeeper_bookie_audit_events_total{{action="{action}",principal="{principal}"}}'
    for line in text.splitlines():
        if line.startswith(want):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture(scope="module")
def written(secure: SandboxCluster) -> SandboxCluster:
    """Entries 0-9 of stream STREAM_ID at term 1 on bookie-1, written with a writer cert."""
    stub = stub_as(secure, Role.WRITER)
    responses = list(stub.Add(iter([add_request(STREAM_ID, 1, range(10), lac=8)]), timeout=10))
    assert list(responses[0].codes) == [pb.OK] * 10
    return secure


def test_a_caller_without_a_certificate_is_refused(written: SandboxCluster) -> None:
    for stub in (
        stub_as(written, None),
        bookie_pb2_grpc.BookieStub(grpc.insecure_channel(written.bookies[0].address)),
    ):
        with pytest.raises(grpc.RpcError) as raised:
            stub.Info(pb.InfoRequest(), timeout=5)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_reader_may_read_but_not_add_fence_truncate_or_trim(written: SandboxCluster) -> None:
    reader = stub_as(written, Role.READER)
    bookie = written.bookies[0]
    before = snapshot(reader, STREAM_ID)
    assert before[1]
    refused_before = audit_count(bookie, "refused", "reader")

    def add() -> None:
        list(reader.Add(iter([add_request(STREAM_ID, 1, [3], lac=8)]), timeout=10))

    denied(add, "Add", "reader")
    denied(
        lambda: reader.Fence(pb.FenceRequest(stream_id=STREAM_ID, term=9), timeout=10),
        "Fence",
        "reader",
    )
    denied(
        lambda: reader.Truncate(
            pb.TruncateRequest(stream_id=STREAM_ID, term=1, after_entry_id=2), timeout=10
        ),
        "Truncate",
        "reader",
    )
    denied(
        lambda: reader.Trim(pb.TrimRequest(stream_id=STREAM_ID, before_entry_id=5), timeout=10),
        "Trim",
        "reader",
    )
    # A recovery read carries a term: a writer's.
    denied(
        lambda: reader.Read(pb.ReadRequest(stream_id=STREAM_ID, entry_id=1, term=2), timeout=10),
        "Read",
        "reader",
    )

    assert snapshot(reader, STREAM_ID) == before
    assert reader.Read(pb.ReadRequest(stream_id=STREAM_ID, entry_id=4), timeout=10).code == pb.OK
    refused = [e for e in audit_events(bookie) if e["action"] == "refused"]
    assert {e["rpc"] for e in refused if e["principal"] == "reader"} >= {
        "Add",
        "Fence",
        "Truncate",
        "Trim",
        "Read",
    }
    assert all(e["peer"].startswith("ipv4:127.0.0.1:") for e in refused)
    assert audit_count(bookie, "refused", "reader") == refused_before + 5


def test_a_writer_may_fence_and_truncate_but_not_trim_a_service_may(
    written: SandboxCluster,
) -> None:
    writer = stub_as(written, Role.WRITER)
    service = stub_as(written, Role.SERVICE)
    before = snapshot(writer, STREAM_ID)
    denied(
        lambda: writer.Trim(pb.TrimRequest(stream_id=STREAM_ID, before_entry_id=2), timeout=10),
        "Trim",
        "writer",
    )
    assert snapshot(writer, STREAM_ID) == before

    fenced = writer.Fence(pb.FenceRequest(stream_id=STREAM_ID, term=2), timeout=10)
    assert fenced.code == pb.OK and fenced.bookie_term == 2
    truncated = writer.Truncate(
        pb.TruncateRequest(stream_id=STREAM_ID, term=2, after_entry_id=8), timeout=10
    )
    assert truncated.code == pb.OK
    trimmed = service.Trim(pb.TrimRequest(stream_id=STREAM_ID, before_entry_id=2), timeout=10)
    assert trimmed.code == pb.OK and trimmed.first_entry_id == 2
    # A takeover's write-back (recovery add) is a writer's too.
    (written_back,) = writer.Add(
        iter([add_request(STREAM_ID, 2, [9], lac=8, recovery=True)]), timeout=10
    )
    assert list(written_back.codes) == [pb.OK]

    events = audit_events(written.bookies[0])
    done = {(e["action"], e["principal"]) for e in events}
    assert {
        ("Fence", "writer"),
        ("Truncate", "writer"),
        ("Trim", "service"),
        ("recovery_add", "writer"),
    } <= done
    assert ("refused", "writer") in done


@pytest.mark.parametrize("data_port", [False, True], ids=["grpc", "data-port"])
def test_the_client_appends_tails_and_takes_over_over_tls(
    secure: SandboxCluster, data_port: bool
) -> None:
    assert secure.tls is not None
    files = secure.tls.client(Role.WRITER)
    name = f"secured-{data_port}"
    with StreamClient.connect(
        secure.metadata,
        tls=files,
        metadata_auth_file=secure.metadata_auth_file,
        writer_options=WriterOptions(data_port=data_port),
        reader_options=ReaderOptions(data_port=data_port),
    ) as client:
        client.create_stream(name, ensemble=3, write_quorum=3, ack_quorum=2)
        first = client.open_writer(name)
        for i in range(100):
            first.append(f"e{i}".encode())
        # A second writer takes over the open stream: fence, recovery reads and write-backs,
        # all with a writer certificate.
        with client.open_writer(name) as second:
            assert second.term > first.term
            second.append(b"after")
        got = [e.payload for e in client.open_reader(name).tail(timeout_s=2)]
        # Over TLS, ranges are read over gRPC whatever the options, the client's or a
        # reader's (gRPC's TLS costs less per byte than the data port's); the bookie's side of
        # TLS reads is tested below.
        own = client.open_reader(name, options=ReaderOptions(data_port=True))
        assert [e.payload for e in own.read(0, 99)] == got[:100]
        assert client._transport._reads is None
    assert got == [f"e{i}".encode() for i in range(100)] + [b"after"]


def test_the_data_port_takes_add_streams_from_writers_only(secure: SandboxCluster) -> None:
    assert secure.tls is not None
    bookie = secure.bookies[0]
    address = data_address(bookie)
    stream_id = STREAM_ID + 1

    def connect(files: TLSConfig) -> RawDataPort:
        return RawDataPort(address, files.client_context()).hello(bookie.bookie_id)

    writer = connect(secure.tls.client(Role.WRITER))
    writer.add(add_request(stream_id, 1, range(5)))
    answer = writer.answer()
    assert isinstance(answer, pb.AddResponse) and list(answer.codes) == [pb.OK]
    assert (answer.first_entry_id, answer.entry_count) == (0, 5)  # the ids as a range
    writer.close()

    refused = audit_count(bookie, "refused", "reader")
    reader = connect(secure.tls.client(Role.READER))
    reader.add(add_request(stream_id, 1, range(5, 10)))
    reason = reader.answer()
    assert reason == (
        "Add refused: principal 'reader' (reader) is not allowed it; it needs the role writer"
    )
    assert reader.answer() is None
    assert audit_count(bookie, "refused", "reader") == refused + 1

    # Without a client certificate the TLS handshake fails (TLS 1.3: at the first read).
    anonymous = RawDataPort(address, TLSConfig(str(secure.tls.ca_file)).client_context())
    with pytest.raises((ssl.SSLError, ConnectionError)):
        anonymous.hello(bookie.bookie_id).add(add_request(stream_id, 1, range(5, 10)))
        if anonymous.answer() is None:
            raise ConnectionError("closed")
    # Plaintext on the TLS port: no answer, the connection is dropped.
    plain = RawDataPort(address)
    with pytest.raises(ConnectionError):
        plain.hello(bookie.bookie_id)
        if plain.answer() is None:
            raise ConnectionError("closed")
    held = stub_as(secure, Role.READER).StreamState(
        pb.StreamStateRequest(stream_id=stream_id), timeout=10
    )
    assert held.last_entry_id == 4  # the writer's five entries, nothing of the others
    # A reader reads them over the data port (`READ_PREAMBLE`), with its certificate.
    ranged = RawDataPort(address, secure.tls.client(Role.READER).client_context())
    ranged.hello(bookie.bookie_id, frames.READ_PREAMBLE)
    ranged.frame(
        frames.READ_RANGE
        + pb.ReadRangeRequest(
            stream_id=stream_id, first_entry_id=0, last_entry_id=9
        ).SerializeToString()
    )
    read = ranged.read_answer()
    assert read is not None and read.code == pb.NO_SUCH_ENTRY
    assert [e.entry_id for e in read.entries] == [0, 1, 2, 3, 4]
    ranged.close()


def test_loose_key_permissions_are_refused(secure: SandboxCluster, tmp_path: Path) -> None:
    assert secure.tls is not None
    files = secure.tls.client(Role.READER)
    key = tmp_path / "reader.key"
    key.write_bytes(Path(str(files.key_file)).read_bytes())
    key.chmod(0o644)
    loose = TLSConfig(files.ca_file, files.cert_file, str(key))
    with pytest.raises(InsecureFileError, match="chmod 0600"):
        StreamClient.connect(
            secure.metadata, tls=loose, metadata_auth_file=secure.metadata_auth_file
        )

    bookie = BookieProcess(
        "loose-bookie",
        tmp_path / "loose-bookie",
        secure.metadata,
        metrics_port=0,
        settings={
            **secure.tls.bookie_settings("bookie-1"),
            "tls_key_file": str(key),
        },
    )
    try:
        assert bookie.start().wait_exit() != 0
        assert "tls_key_file is readable or writable by group or others" in bookie.log_tail()
    finally:
        bookie.close()


def test_an_insecure_bookie_beyond_loopback_refuses_to_start(
    secure: SandboxCluster, tmp_path: Path
) -> None:
    """On loopback it starts; without TLS no role applies, and a Fence is still audited."""
    bookie = BookieProcess(
        "open",
        tmp_path / "open",
        secure.metadata,
        metrics_port=0,
        settings={"autorecovery": False, "metadata_auth_file": str(secure.metadata_auth_file)},
        unsafe_skips=METADATA_UNCHECKED,  # its raw requests name no stream of metadata
    )
    bookie.settings["listen"] = f"0.0.0.0:{bookie.port}"
    try:
        assert bookie.start().wait_exit() != 0
        assert "allow_insecure" in bookie.log_tail() and "not a loopback" in bookie.log_tail()
        del bookie.settings["listen"]
        bookie.start().wait_ready()
        fenced = bookie.stub().Fence(pb.FenceRequest(stream_id=5, term=3), timeout=10)
        assert fenced.code == pb.OK
        assert [(e["action"], e["principal"]) for e in audit_events(bookie)] == [
            ("Fence", "anonymous")
        ]
    finally:
        bookie.close()


def served_certificate(address: str, files: TLSConfig) -> bytes:
    """The DER certificate a new TLS connection to `address` is shown."""
    context = ssl.create_default_context(cafile=files.ca_file)
    context.load_cert_chain(str(files.cert_file), str(files.key_file))
    context.set_alpn_protocols(["h2"])
    host, port = address.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_certificates_rotate_on_sighup_while_a_writer_appends(secure: SandboxCluster) -> None:
    assert secure.tls is not None
    files = secure.tls.client(Role.WRITER)
    bookie = secure.bookies[0]
    old = served_certificate(bookie.address, files)
    old_data = served_certificate(data_address(bookie), files)
    errors: list[BaseException] = []
    appended: list[int] = []
    stop = threading.Event()

    with StreamClient.connect(
        secure.metadata, tls=files, metadata_auth_file=secure.metadata_auth_file
    ) as client:
        client.create_stream("rotating", ensemble=3, write_quorum=3, ack_quorum=3)
        with client.open_writer("rotating") as writer:

            def append() -> None:
                try:
                    while not stop.is_set():
                        appended.append(writer.append(b"x" * 100, timeout_s=10))
                except BaseException as e:
                    errors.append(e)

            thread = threading.Thread(target=append)
            thread.start()
            try:
                wait_until(lambda: len(appended) > 50, what="appends before rotation")
                issue(secure.tls.directory, bookie.bookie_id, Role.SERVICE, force=True)
                os.kill(bookie.pid, signal.SIGHUP)
                new = wait_until(
                    lambda: (der := served_certificate(bookie.address, files)) != old and der,
                    what="the new certificate served",
                )
                # The data port's next handshakes show it too; its open streams go on.
                wait_until(
                    lambda: served_certificate(data_address(bookie), files) not in (old_data, old),
                    what="the new certificate served on the data port",
                )
                count = len(appended)
                wait_until(lambda: len(appended) > count + 50, what="appends after rotation")
            finally:
                stop.set()
                thread.join(30)
    assert not errors
    assert appended == list(range(len(appended)))
    assert new != old
    assert any('"tls.reloaded"' in line for line in bookie.log_path.read_text().splitlines())


def test_the_secure_sandbox_demo_runs_over_tls_with_roles(tmp_path: Path) -> None:
    """`streamctl sandbox --secure --demo`: the append-and-tail demo (a writer's certificate
    appends, a reader's tails) and the retention service, all over mutual TLS."""
    data_dir = tmp_path / "sandbox"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stream.cli.main",
            "sandbox",
            "--secure",
            "--demo",
            "--bookies",
            "3",
            "--data-dir",
            str(data_dir),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"STREAMKEEPER_TLS_CA_FILE={data_dir / 'tls' / 'ca.crt'}" in done.stderr
    assert "demo passed" in done.stdout + done.stderr
    audited = [
        json.loads(line)
        for log in data_dir.glob("bookie-*/bookie.log")
        for line in log.read_text().splitlines()
        if '"bookie.audit"' in line
    ]
    assert audited and not [e for e in audited if e["action"] == "refused"]
    rounds = (data_dir / "retention.log").read_text()
    assert '"retention.round"' in rounds and '"errors": 0' in rounds


def test_a_bookie_repairs_itself_from_its_peers_over_tls(
    zookeeper: ZooKeeperServer, tmp_path: Path
) -> None:
    """BP-46 phase two after a kill -9 without the journal: the restarted bookie calls its
    peers (bookie to bookie) with its own `service` certificate."""
    with running_cluster(zookeeper, tmp_path, secure=True, journal_write_data=False) as cluster:
        assert cluster.tls is not None
        with StreamClient.connect(
            cluster.metadata,
            tls=cluster.tls.client(Role.WRITER),
            metadata_auth_file=cluster.metadata_auth_file,
        ) as c:
            c.create_stream("repaired", ensemble=3, write_quorum=3, ack_quorum=2)
            with c.open_writer("repaired") as writer:
                for i in range(200):
                    writer.append(f"r{i}".encode())
            stream_id = c.stream_info("repaired").stream_id
        victim = cluster.bookies[0]
        victim.kill9()
        victim.start()
        stub = victim.stub()

        def repaired() -> bool:
            try:
                state = stub.StreamState(pb.StreamStateRequest(stream_id=stream_id), timeout=5)
            except grpc.RpcError:
                return False
            return state.code == pb.OK and not state.limbo

        wait_until(repaired, timeout_s=60, what="the victim out of limbo")
        peers = [e for b in cluster.bookies[1:] for e in audit_events(b)]
        assert ("Fence", victim.bookie_id) in {(e["action"], e["principal"]) for e in peers}
        assert not [e for e in peers if e["action"] == "refused"]


def test_streamctl_reaches_a_tls_bookie_with_the_tls_options(
    written: SandboxCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    assert written.tls is not None
    reader = written.tls.client(Role.READER)
    address = written.bookies[0].address
    info = ["--output", "json", "bookie", "info", "--address", address, "--timeout", "5"]
    tls = ["--tls-ca", reader.ca_file, "--tls-cert", str(reader.cert_file)]
    assert main([*tls, "--tls-key", str(reader.key_file), *info]) == 0
    assert json.loads(capsys.readouterr().out)["bookie_id"] == "bookie-1"
    assert main(info) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err
    assert main(["--tls-cert", str(reader.cert_file), *info]) == 2
    assert "need --tls-ca" in capsys.readouterr().err


def test_tls_without_client_auth_encrypts_and_applies_no_role(
    secure: SandboxCluster, tmp_path: Path
) -> None:
    assert secure.tls is not None
    bookie = BookieProcess(
        "tls-only",
        tmp_path / "tls-only",
        secure.metadata,
        metrics_port=0,
        settings={
            **secure.tls.bookie_settings("tls-only"),
            "tls_client_auth": "none",
            "autorecovery": False,
            "metadata_auth_file": str(secure.metadata_auth_file),
        },
        tls=TLSConfig(str(secure.tls.ca_file)),
        unsafe_skips=METADATA_UNCHECKED,  # its raw requests name no stream of metadata
    )
    try:
        bookie.start().wait_ready()
        fenced = bookie.stub().Fence(pb.FenceRequest(stream_id=5, term=3), timeout=10)
        assert fenced.code == pb.OK
        assert [(e["action"], e["principal"]) for e in audit_events(bookie)] == [
            ("Fence", "anonymous")
        ]
        plaintext = bookie_pb2_grpc.BookieStub(grpc.insecure_channel(bookie.address))
        with pytest.raises(grpc.RpcError):
            plaintext.Info(pb.InfoRequest(), timeout=5)
    finally:
        bookie.close()


POISON = (1 << 64) - 1
REAL = [f"real-{i}".encode() for i in range(4)]


def test_the_attacks_with_a_writer_certificate_are_refused(
    zookeeper: ZooKeeperServer, tmp_path: Path
) -> None:
    """An authenticated caller gets no more than metadata justifies: with a valid writer
    certificate, the poisoned term and the overwrite below the LAC are refused (the trim is
    beyond a writer's role; a service's unjustified trim is refused too), nothing changes,
    each refusal names the principal, and the stream keeps working."""
    with running_cluster(zookeeper, tmp_path / "attacked", secure=True) as cluster:
        assert cluster.tls is not None
        files = cluster.tls.client(Role.WRITER)
        with StreamClient.connect(
            cluster.metadata, tls=files, metadata_auth_file=cluster.metadata_auth_file
        ) as client:
            client.create_stream("victim", ensemble=3, write_quorum=3, ack_quorum=2)
            writer = client.open_writer("victim")
            for payload in REAL:
                writer.append(payload)
            stream_id = client.stream_info("victim").stream_id
            term = writer.term
            stubs = [stub_as(cluster, Role.WRITER, i) for i in range(3)]
            wait_until(
                lambda: all(snapshot_state(s, stream_id).lac >= 3 for s in stubs), what="LAC 3"
            )
            before = [held(s, stream_id) for s in stubs]

            forged = pb.AddRequest(
                stream_id=stream_id,
                term=term,
                lac=3,
                lafr=3,
                entries=[make_entry(stream_id, 2, b"FORGED")],
            )
            for stub in stubs:
                (response,) = add_all(stub, [forged])
                assert list(response.codes) == [pb.BAD_REQUEST], response
            poisoned = stubs[0].Fence(pb.FenceRequest(stream_id=stream_id, term=POISON), timeout=10)
            assert poisoned.code == pb.BAD_REQUEST and poisoned.bookie_term == term, poisoned
            denied(
                lambda: stubs[0].Trim(
                    pb.TrimRequest(stream_id=stream_id, before_entry_id=2), timeout=10
                ),
                "Trim",
                "writer",
            )
            service = stub_as(cluster, Role.SERVICE)
            trimmed = service.Trim(
                pb.TrimRequest(stream_id=stream_id, before_entry_id=1_000_000), timeout=10
            )
            assert trimmed.code == pb.BAD_REQUEST, trimmed

            assert [held(s, stream_id) for s in stubs] == before
            assert [e.payload for e in client.open_reader("victim").read(0, 3)] == REAL
            bookie = cluster.bookies[0]
            wait_until(
                lambda: (
                    {(e["rpc"], e["principal"]) for e in logged(bookie, "bookie.request_refused")}
                    >= {("Add", "writer"), ("Fence", "writer"), ("Trim", "service")}
                ),
                what="the refusals logged with their principals",
            )

            assert writer.append(b"real-4") == 4
            writer.close()
            with client.open_writer("victim") as second:
                assert second.term == term + 1
                fifth = second.append(b"real-5")
            payloads = [e.payload for e in client.open_reader("victim").read(0, fifth)]
            assert payloads == [*REAL, b"real-4", b"real-5"]


def held(stub: Any, stream_id: int) -> tuple[int, int, int, list[bytes]]:
    """What an attack could change on a bookie: the term, the first and last entry ids, and
    the entries (the LAC and LAFR move with the writer's own updates)."""
    state, entries = snapshot(stub, stream_id)
    parsed = pb.StreamStateResponse.FromString(state)
    return parsed.term, parsed.first_entry_id, parsed.last_entry_id, entries


def snapshot_state(stub: Any, stream_id: int) -> pb.StreamStateResponse:
    return stub.StreamState(pb.StreamStateRequest(stream_id=stream_id), timeout=10)


def logged(bookie: BookieProcess, event: str) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for line in bookie.log_path.read_text().splitlines()
        if f'"{event}"' in line
    ]
