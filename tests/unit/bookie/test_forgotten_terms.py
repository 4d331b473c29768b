"""A bookie that lost its disk learns a stream's forgotten term from metadata before it serves a
term-bearing request for a stream it holds no state for (docs/design.md §4): the durable bound, and
the service over the real storage engine with a fake metadata reader (one read per stream, shared by
requests arriving together; deleted streams refused; metadata unavailable -> try again)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from stream.bookie.storage import StreamStorage
from stream.bookie.terms import (
    MetadataTerms,
    StreamFacts,
    forgotten_terms_bound,
    note_forgotten_terms,
)
from stream.errors import MetadataError, StorageError
from stream.wire import bookie_pb2 as pb

from .storage_support import make_config
from .test_server import Harness, add, add_codes, run

BELOW = 10
# Metadata's terms (None: deleted). Stream 6 fails its first read; stream 10 was created after
# the disk's loss.
METADATA = {3: 5, 4: None, 6: 2, 7: 2, 8: 3, 9: 2, 10: 1}


def test_the_bound_is_durable_and_only_rises(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    assert forgotten_terms_bound(config) == 0
    note_forgotten_terms(config, 12)
    note_forgotten_terms(config, 7)  # never lowered
    assert forgotten_terms_bound(config) == 12
    (config.index_path / "FORGOTTEN_TERMS_BELOW").write_text("twelve")
    with pytest.raises(StorageError):
        forgotten_terms_bound(config)


class FakeMetadata:
    def __init__(self) -> None:
        self.reads: list[int] = []
        self.failed: set[int] = set()

    async def read_facts(self, stream_id: int) -> StreamFacts | None:
        self.reads.append(stream_id)
        await asyncio.sleep(0.05)  # requests arriving meanwhile must share this read
        if stream_id == 6 and stream_id not in self.failed:
            self.failed.add(stream_id)
            raise MetadataError("ZooKeeper unavailable")
        term = METADATA[stream_id]
        return None if term is None else StreamFacts(term, 0)


def run_wiped(tmp_path: Path, body, metadata: FakeMetadata) -> None:  # type: ignore[no-untyped-def]
    def terms(storage: StreamStorage) -> MetadataTerms:
        return MetadataTerms(storage, metadata.read_facts, forgotten_below=BELOW)

    run(tmp_path, body, metadata_terms=terms)


def test_a_superseded_writer_of_a_forgotten_stream_gets_invalid_term(tmp_path: Path) -> None:
    metadata = FakeMetadata()

    async def body(h: Harness) -> None:
        assert await add_codes(h, add(3, 4, range(1))) == ([pb.INVALID_TERM], 5)
        assert h.storage.stream_state(3).term == 5  # recorded (journaled) once learned
        assert await add_codes(h, add(3, 5, range(1))) == ([pb.OK], 5)
        fence = await h.stub.Fence(pb.FenceRequest(stream_id=9, term=1))
        assert (fence.code, fence.bookie_term) == (pb.INVALID_TERM, 2)
        read = await h.stub.Read(pb.ReadRequest(stream_id=8, entry_id=0, term=2))
        assert (read.code, read.bookie_term) == (pb.INVALID_TERM, 3)
        truncate = await h.stub.Truncate(pb.TruncateRequest(stream_id=7, term=1, after_entry_id=-1))
        assert (truncate.code, truncate.bookie_term) == (pb.INVALID_TERM, 2)
        assert metadata.reads == [3, 9, 8, 7]
        # No metadata read: a normal read carries no term. A stream created after the disk's
        # loss (id >= the bound) never had a term here: read once to justify its first term.
        assert (await h.stub.Read(pb.ReadRequest(stream_id=5, entry_id=0))).code == (
            pb.NO_SUCH_STREAM
        )
        assert await add_codes(h, add(BELOW, 1, range(1))) == ([pb.OK], 1)
        assert await add_codes(h, add(BELOW, 1, range(1, 2))) == ([pb.OK], 1)
        assert metadata.reads == [3, 9, 8, 7, BELOW]

    run_wiped(tmp_path, body, metadata)


def test_requests_arriving_together_share_one_read(tmp_path: Path) -> None:
    metadata = FakeMetadata()

    async def body(h: Harness) -> None:
        fences = [h.stub.Fence(pb.FenceRequest(stream_id=7, term=t)) for t in (1, 2, 3, 1, 2)]
        codes = [(r.code, r.bookie_term) for r in await asyncio.gather(*fences)]
        assert metadata.reads == [7]
        # In whatever order they arrive, term 1 is below metadata's term 2, and term 3 above
        # it was never handed out: refused, nothing recorded.
        assert codes[0][0] == codes[3][0] == pb.INVALID_TERM
        assert codes[1] == codes[4] == (pb.OK, 2) and codes[2] == (pb.BAD_REQUEST, 2)
        assert h.storage.stream_state(7).term == 2

    run_wiped(tmp_path, body, metadata)


def test_deleted_streams_and_unavailable_metadata_are_refused(tmp_path: Path) -> None:
    metadata = FakeMetadata()

    async def body(h: Harness) -> None:
        for _ in range(2):
            codes, _ = await add_codes(h, add(4, 1, range(2)))
            assert codes == [pb.NO_SUCH_STREAM] * 2
        fence = await h.stub.Fence(pb.FenceRequest(stream_id=4, term=7))
        assert fence.code == pb.NO_SUCH_STREAM and "deleted" in fence.message
        assert metadata.reads == [4]  # a deleted stream is read once
        assert h.storage.stream_state(4) is None
        # Metadata cannot tell now: an unknown answer (never the old term's OK), then served.
        busy = await h.stub.Fence(pb.FenceRequest(stream_id=6, term=1))
        assert busy.code == pb.TOO_BUSY and "cannot read the term" in busy.message
        assert h.storage.stream_state(6) is None
        assert (await h.stub.Fence(pb.FenceRequest(stream_id=6, term=1))).code == (pb.INVALID_TERM)
        assert metadata.reads == [4, 6, 6]

    run_wiped(tmp_path, body, metadata)
