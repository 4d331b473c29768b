"""Operators and scripts get the true reason at once (issue 17), on real processes: an entry
larger than the bookies accept, a stream created with more bookies than are registered, a
writer whose stream was deleted or trimmed under it, and an append that timed out."""

from __future__ import annotations

import os
import signal
import time

import pytest

from stream.client import StreamClient, WriterOptions
from stream.errors import (
    AppendTimeoutError,
    EntryTrimmedError,
    InvalidArgumentError,
    NotEnoughBookiesError,
    StreamInUseError,
    StreamNotFoundError,
)
from stream.sandbox.cluster import SandboxCluster
from stream.wire import bookie_pb2 as pb
from tests.integration.cli_support import streamctl
from tests.integration.conftest import ClusterFactory

pytestmark = pytest.mark.integration

# Tests marked shared_cluster share one cluster of default bookies (see tests/integration/
# conftest.py): they kill no bookie and use streams of their own.
_LIMIT = 64 << 10


def test_oversized_entry_is_refused_before_sending_and_the_writer_stays_usable(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(3, max_entry_bytes=_LIMIT)
    with StreamClient.connect(cluster.metadata) as client:
        client.create_stream("big", ensemble=3, write_quorum=3, ack_quorum=2)
        with client.open_writer("big") as writer:
            assert writer.append(b"before") == 0
            started = time.monotonic()
            with pytest.raises(InvalidArgumentError, match="max_entry_bytes") as raised:
                writer.append(b"x" * (_LIMIT + 1), timeout_s=30)
            assert time.monotonic() - started < 1
            assert raised.value.context["max_entry_bytes"] == _LIMIT
            with pytest.raises(InvalidArgumentError):
                writer.append_async(bytearray(_LIMIT + 1))
            assert writer.append(b"y" * _LIMIT, timeout_s=30) == 1
            assert writer.append(b"after", timeout_s=30) == 2
        got = [e.payload for e in client.open_reader("big").read(0, 2)]
        assert got == [b"before", b"y" * _LIMIT, b"after"]


@pytest.mark.shared_cluster
def test_create_stream_with_more_bookies_than_registered_fails_at_once(
    cluster: SandboxCluster,
) -> None:
    with StreamClient.connect(cluster.metadata) as client:
        with pytest.raises(NotEnoughBookiesError, match="allow_fewer_bookies") as raised:
            client.create_stream("wide", ensemble=5, write_quorum=3, ack_quorum=2)
        assert raised.value.context["needed"] == 5
        assert raised.value.context["available"] == 3
        assert "wide" not in client.list_streams()
        # The opt-out, for bookies added later.
        meta = client.create_stream(
            "wide", ensemble=5, write_quorum=3, ack_quorum=2, allow_fewer_bookies=True
        )
        assert meta.ensemble == 5
        assert client.create_stream("narrow", ensemble=3).ensemble == 3


@pytest.mark.shared_cluster
def test_streamctl_create_with_more_bookies_than_registered_fails_at_once(
    cluster: SandboxCluster,
) -> None:
    refused = streamctl(cluster.metadata, "create", "wide-cli", "--ensemble", "5")
    assert refused.returncode == 4  # unavailable: more bookies may come
    assert "not enough writable bookies" in refused.stderr
    assert "--allow-fewer-bookies" in refused.stderr
    created = streamctl(
        cluster.metadata, "create", "wide-cli", "--ensemble", "5", "--allow-fewer-bookies"
    )
    assert created.returncode == 0, created.stderr
    with StreamClient.connect(cluster.metadata) as client:
        assert client.stream_info("wide-cli").fragments == []


@pytest.mark.shared_cluster
def test_writer_of_a_stream_deleted_under_it_gets_stream_not_found(
    cluster: SandboxCluster,
) -> None:
    with StreamClient.connect(cluster.metadata) as client:
        client.create_stream("doomed", ensemble=3, write_quorum=3, ack_quorum=2)
        with client.open_writer("doomed") as writer:
            assert writer.append(b"kept until deleted") == 0
            client.delete_stream("doomed", force=True)
            started = time.monotonic()
            with pytest.raises(StreamNotFoundError, match="deleted while this writer") as raised:
                writer.append(b"into the void", timeout_s=30)
            assert time.monotonic() - started < 3
            assert "replace" not in str(raised.value)
            # The writer stays stopped with the same reason.
            with pytest.raises(StreamNotFoundError):
                writer.append(b"again", timeout_s=30)


def test_writer_whose_entries_were_trimmed_under_it_gets_entry_trimmed(
    cluster_factory: ClusterFactory,
) -> None:
    # Bookies refuse a trim beyond metadata's first retained entry: only with that check
    # switched off (test-only) can something trim them under a writer.
    cluster = cluster_factory(3, unsafe_skips=("trim_check",))
    with StreamClient.connect(cluster.metadata) as client:
        client.create_stream("cut", ensemble=3, write_quorum=3, ack_quorum=2)
        with client.open_writer("cut") as writer:
            for i in range(5):
                writer.append(b"entry %d" % i)
            stream_id = client.stream_info("cut").stream_id
            # Something trims the bookies past the entries being written (not the client's
            # trim, which keeps the last fragment).
            for bookie in cluster.bookies:
                request = pb.TrimRequest(stream_id=stream_id, before_entry_id=1000)
                assert bookie.stub().Trim(request, timeout=10).code == pb.OK
            started = time.monotonic()
            with pytest.raises(EntryTrimmedError, match="trimmed under the writer") as raised:
                writer.append(b"below the bookies' first entry", timeout_s=30)
            assert time.monotonic() - started < 3
            assert "replace" not in str(raised.value)


@pytest.mark.shared_cluster
def test_delete_of_a_stream_with_a_live_writer_needs_force(
    cluster: SandboxCluster,
) -> None:
    with StreamClient.connect(cluster.metadata) as client:
        client.create_stream("busy", ensemble=3, write_quorum=3, ack_quorum=2)
        with client.open_writer("busy") as writer:
            writer.append(b"x")
            with pytest.raises(StreamInUseError, match="force=True") as raised:
                client.delete_stream("busy")
            assert raised.value.context["pid"] == os.getpid()
            refused = streamctl(cluster.metadata, "delete", "busy")
            assert refused.returncode == 5  # conflict: a live writer has it
            assert "live writer" in refused.stderr and "--force" in refused.stderr
            assert client.stream_info("busy").lac == 0
            forced = streamctl(cluster.metadata, "delete", "busy", "--force")
            assert forced.returncode == 0, forced.stderr
            assert "busy" not in client.list_streams()
        # Without a live writer, no force is needed.
        client.create_stream("idle", ensemble=3, write_quorum=3, ack_quorum=2)
        with client.open_writer("idle") as writer:
            writer.append(b"y")
        client.delete_stream("idle")
        assert "idle" not in client.list_streams()


def test_append_timeout_raises_append_timeout_error_and_the_writer_goes_on(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(3)
    options = WriterOptions(add_timeout_s=30.0)
    with StreamClient.connect(cluster.metadata, writer_options=options) as client:
        client.create_stream("slow", ensemble=3, write_quorum=3, ack_quorum=2)
        with client.open_writer("slow") as writer:
            assert writer.append(b"first") == 0
            # Two of three frozen: no ack quorum, but no failure either (add timeout 30 s).
            frozen = [cluster.bookies[0].pid, cluster.bookies[1].pid]
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)
            try:
                with pytest.raises(AppendTimeoutError, match="may still be written") as raised:
                    writer.append(b"late", timeout_s=0.5)
                assert isinstance(raised.value, TimeoutError)
                assert raised.value.context == {"stream": "slow", "timeout_s": 0.5}
            finally:
                for pid in frozen:
                    os.kill(pid, signal.SIGCONT)
            # It was written after all, and the writer goes on.
            assert writer.append(b"next", timeout_s=30) == 2
        got = [e.payload for e in client.open_reader("slow").read(0, 2)]
        assert got == [b"first", b"late", b"next"]
