"""A SEALED stream stays readable to its end after its bookies restart, on real processes: the
LAC the seal published to them is not durable, so the reader takes the end from the metadata
(found by the simulator's random runs: a sealed stream whose bookies all restarted read as
empty, and a tail of it waited forever)."""

from __future__ import annotations

import contextlib

import pytest

from stream.client import StreamClient, WriterOptions
from stream.errors import StreamError
from tests.integration.conftest import ClusterFactory

pytestmark = pytest.mark.integration


def test_a_sealed_stream_is_read_to_its_end_after_its_bookies_restart(
    cluster_factory: ClusterFactory,
) -> None:
    # No flush before the crash: the LAC the seal published is in the bookies' memory only.
    cluster = cluster_factory(3, flush_interval_ms=600_000)
    payloads = [f"sealed-{i}".encode() for i in range(10)]
    # No explicit LAC after the last append before the seal fences the writer: the bookies' LAC
    # stays one behind, and so does the LAC the seal's recovery writes with the entries
    # (durable); only the LAC it publishes last (in memory) names the end.
    lazy = WriterOptions(explicit_lac_delay_s=10.0)
    with StreamClient.connect(cluster.metadata, writer_options=lazy) as client:
        client.create_stream("ended", ensemble=3, write_quorum=3, ack_quorum=2)
        writer = client.open_writer("ended")
        for p in payloads:
            writer.append(p)
        # The writer is gone without closing its fragment; another client seals the stream.
        with StreamClient.connect(cluster.metadata) as sealer:
            sealer.seal_stream("ended")
        with contextlib.suppress(StreamError):
            writer.close()
    for bookie in cluster.bookies:
        bookie.restart(clean=False)  # kill -9: what the seal published in memory is gone
    with StreamClient.connect(cluster.metadata) as client:
        reader = client.open_reader("ended")
        assert reader.last_add_confirmed() >= len(payloads) - 1
        assert [e.payload for e in reader.read(0, len(payloads) - 1)] == payloads
