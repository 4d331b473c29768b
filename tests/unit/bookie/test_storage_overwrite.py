"""An add never replaces an entry at or below the bookie's LAC with other bytes (docs/design.md
§4): a forged entry with a correct checksum is refused (whether the stored one is in the write
cache or in an entry log) and the rest of its batch stored; the same entry again, an earlier
term's NOOP|TRUNCATE written back as a plain NOOP, and anything above the LAC still go through;
a TRUNCATE entry at or below the LAC never deletes the acknowledged entries above it."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream.bookie.storage import StreamStorage
from stream.bookie.unsafe import parse_unsafe_skips
from stream.wire import bookie_pb2 as pb

from .storage_support import add_request, entry, flush, make_config, open_storage, wait

S = 7
NOOP = pb.NOOP
NOOP_TRUNCATE = pb.NOOP | pb.TRUNCATE


@pytest.fixture
def storage(tmp_path: Path):
    s, _ = open_storage(make_config(tmp_path))
    yield s
    s.close()


def acknowledged(storage: StreamStorage, count: int, lac: int) -> list[pb.Entry]:
    entries = [entry(S, i) for i in range(count)]
    wait(storage.add_batch(add_request(S, 1, entries, lac=lac, lafr=lac)).durable)
    return entries


@pytest.mark.parametrize("flushed", [False, True])
def test_a_forged_entry_below_the_lac_is_refused(storage: StreamStorage, flushed: bool) -> None:
    real = acknowledged(storage, 4, lac=3)
    if flushed:
        flush(storage)
    # The forgery, the same entry again (a retried add) and an entry above the LAC.
    batch = [entry(S, 2, b"FORGED"), real[1], entry(S, 4)]
    outcome = storage.add_batch(add_request(S, 1, batch, lac=3, lafr=4))
    wait(outcome.durable)
    assert outcome.codes == [pb.BAD_REQUEST, pb.OK, pb.OK]
    assert "entry 2 is at or below the LAC 3" in outcome.refused_overwrite
    assert outcome.refused_overwrite in outcome.message
    assert [storage.read(S, i).entry for i in range(4)] == real
    assert storage.read(S, 4).code == pb.OK
    # Above the LAC an earlier term's unacknowledged entry is overwritten (recovery).
    rewritten = entry(S, 4, b"rewritten")
    wait(storage.add_batch(add_request(S, 2, [rewritten], recovery=True)).durable)
    assert storage.read(S, 4).entry == rewritten


def test_truncate_entries_below_the_lac(storage: StreamStorage) -> None:
    acknowledged(storage, 2, lac=1)
    noop = entry(S, 2, b"", flags=NOOP_TRUNCATE)
    wait(storage.add_batch(add_request(S, 1, [noop])).durable)
    real = entry(S, 3)
    wait(storage.add_batch(add_request(S, 2, [real], lac=3, lafr=3)).durable)
    # An earlier term's truncate no-op written back as a plain no-op: taken, deletes nothing.
    plain = entry(S, 2, b"", flags=NOOP)
    outcome = storage.add_batch(add_request(S, 3, [plain], recovery=True))
    wait(outcome.durable)
    assert outcome.codes == [pb.OK]
    assert storage.read(S, 2).entry == plain
    # A truncate entry at or below the LAC, held here or not: refused, deletes nothing.
    for entry_id in (2, 1):
        truncate = entry(S, entry_id, b"", flags=NOOP_TRUNCATE)
        outcome = storage.add_batch(add_request(S, 3, [truncate], recovery=True))
        assert outcome.codes == [pb.BAD_REQUEST]
        assert "would delete acknowledged entries" in outcome.refused_overwrite
    assert storage.read(S, 3).entry == real
    assert storage.read(S, 2).entry == plain
    assert storage.stream_state(S).last_entry_id == 3


def test_the_test_only_switch_lets_the_forgery_through(tmp_path: Path) -> None:
    storage = StreamStorage(make_config(tmp_path), unsafe=parse_unsafe_skips("overwrite_check"))
    storage.open()
    try:
        acknowledged(storage, 4, lac=3)
        forged = entry(S, 2, b"FORGED")
        wait(storage.add_batch(add_request(S, 1, [forged], lac=3)).durable)
        assert storage.read(S, 2).entry == forged
    finally:
        storage.close()
