"""The service's checks against metadata over the real storage engine, with a fake metadata
reader: a term above the bookie's is served only when metadata's term is at least as high (read
once per takeover, nothing recorded when refused), and a Trim never goes beyond metadata's first
retained entry (a deleted stream may be trimmed entirely); metadata unavailable -> TOO_BUSY."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import REGISTRY

from stream.bookie.storage import StreamStorage
from stream.bookie.terms import MetadataTerms, StreamFacts
from stream.errors import MetadataError
from stream.wire import bookie_pb2 as pb

from .test_server import Harness, add, add_codes, run


class FakeMetadata:
    """Streams' (term, first retained entry); a missing stream was deleted."""

    def __init__(self) -> None:
        self.facts: dict[int, StreamFacts] = {3: StreamFacts(2, 0), 4: StreamFacts(1, 10)}
        self.reads: list[int] = []
        self.unavailable = False

    async def read_facts(self, stream_id: int) -> StreamFacts | None:
        self.reads.append(stream_id)
        await asyncio.sleep(0)
        if self.unavailable:
            raise MetadataError("ZooKeeper unavailable")
        return self.facts.get(stream_id)


def run_checked(tmp_path: Path, body, metadata: FakeMetadata) -> None:  # type: ignore[no-untyped-def]
    def terms(storage: StreamStorage) -> MetadataTerms:
        return MetadataTerms(storage, metadata.read_facts)

    run(tmp_path, body, metadata_terms=terms)


def refused(rpc: str, reason: str) -> float:
    labels = {"rpc": rpc, "reason": reason}
    return REGISTRY.get_sample_value("streamkeeper_bookie_refused_total", labels) or 0.0


def test_a_term_metadata_never_handed_out_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    metadata = FakeMetadata()

    async def body(h: Harness) -> None:
        before = refused("Fence", "unjustified_term")
        poisoned = await h.stub.Fence(pb.FenceRequest(stream_id=3, term=(1 << 64) - 1))
        assert (poisoned.code, poisoned.bookie_term) == (pb.BAD_REQUEST, 0)
        assert "metadata's term for stream 3 is 2" in poisoned.message
        assert h.storage.stream_state(3) is None  # nothing recorded
        assert refused("Fence", "unjustified_term") == before + 1
        # A term metadata was already seen to hold, and adds at the bookie's term, read nothing.
        fence = await h.stub.Fence(pb.FenceRequest(stream_id=3, term=2))
        assert (fence.code, fence.bookie_term) == (pb.OK, 2)
        assert await add_codes(h, add(3, 2, range(2), lac=0)) == ([pb.OK, pb.OK], 2)
        assert metadata.reads == [3]
        # A takeover: metadata's term first, then the bookies see it (one read).
        metadata.facts[3] = StreamFacts(3, 0)
        assert await add_codes(h, add(3, 3, range(2, 3))) == ([pb.OK], 3)
        assert await add_codes(h, add(3, 4, range(3, 4))) == ([pb.BAD_REQUEST], 3)
        assert metadata.reads == [3, 3, 3]
        for term, rpc in ((4, "Truncate"), (4, "Read")):
            if rpc == "Truncate":
                response = await h.stub.Truncate(
                    pb.TruncateRequest(stream_id=3, term=term, after_entry_id=0)
                )
            else:
                response = await h.stub.Read(pb.ReadRequest(stream_id=3, entry_id=0, term=term))
            assert (response.code, response.bookie_term) == (pb.BAD_REQUEST, 3), rpc
        assert h.storage.stream_state(3).term == 3
        assert h.storage.stream_state(3).last_entry_id == 2

    run_checked(tmp_path, body, metadata)


def test_deleted_streams_and_unavailable_metadata_are_refused(tmp_path: Path) -> None:
    metadata = FakeMetadata()

    async def body(h: Harness) -> None:
        assert await add_codes(h, add(9, 1, range(1))) == ([pb.NO_SUCH_STREAM], 0)
        assert await add_codes(h, add(4, 1, range(2), lac=1)) == ([pb.OK, pb.OK], 1)
        metadata.unavailable = True
        busy = await h.stub.Fence(pb.FenceRequest(stream_id=3, term=1))
        assert busy.code == pb.TOO_BUSY and "cannot read the term" in busy.message
        assert h.storage.stream_state(3) is None
        trim = await h.stub.Trim(pb.TrimRequest(stream_id=4, before_entry_id=1))
        assert trim.code == pb.TOO_BUSY
        assert h.storage.stream_state(4).first_entry_id == 0
        metadata.unavailable = False
        assert (await h.stub.Fence(pb.FenceRequest(stream_id=3, term=1))).code == pb.OK

    run_checked(tmp_path, body, metadata)


def test_a_trim_never_goes_beyond_metadatas_first_retained_entry(tmp_path: Path) -> None:
    metadata = FakeMetadata()

    async def body(h: Harness) -> None:
        assert await add_codes(h, add(4, 1, range(20), lac=19)) == ([pb.OK] * 20, 1)
        for before in (11, 1_000_000):
            trim = await h.stub.Trim(pb.TrimRequest(stream_id=4, before_entry_id=before))
            assert (trim.code, trim.first_entry_id) == (pb.BAD_REQUEST, 0)
            assert "beyond metadata's first retained entry 10" in trim.message
        assert h.storage.stream_state(4).first_entry_id == 0
        assert (await h.stub.Read(pb.ReadRequest(stream_id=4, entry_id=15))).code == pb.OK
        trim = await h.stub.Trim(pb.TrimRequest(stream_id=4, before_entry_id=10))
        assert (trim.code, trim.first_entry_id) == (pb.OK, 10)
        reads = len(metadata.reads)  # a trim that moves nothing here reads no metadata
        trim = await h.stub.Trim(pb.TrimRequest(stream_id=4, before_entry_id=10))
        assert (trim.code, trim.first_entry_id, len(metadata.reads)) == (pb.OK, 10, reads)
        # Deleted from metadata: everything may go (the client trims it all after a delete).
        del metadata.facts[4]
        trim = await h.stub.Trim(pb.TrimRequest(stream_id=4, before_entry_id=(1 << 63) - 1))
        assert trim.code == pb.OK

    run_checked(tmp_path, body, metadata)
