"""An add never replaces an entry at or below the bookie's LAC with other bytes (docs/design.md
§4): a forged entry with a correct checksum is refused (whether the stored one is in the write
cache or in an entry log) and the rest of its batch stored; the same entry again, an earlier
term's NOOP|TRUNCATE written back as a plain NOOP, and anything above the LAC still go through;
a TRUNCATE entry at or below the LAC never deletes the acknowledged entries above it."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream.bookie.storage import StreamStorage
from stream.bookie.unsafe import UNSAFE_SKIP_ENV
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
    batch = [entry(S, 2, b"FORGED"), entry(S, 4)]
    outcome = storage.add_batch(add_request(S, 1, batch, lac=3, lafr=4))
    wait(outcome.durable)
    assert outcome.codes == [pb.BAD_REQUEST, pb.OK]
    assert "entry 2 is at or below the LAC 3" in outcome.refused_overwrite
    assert outcome.refused_overwrite in outcome.message
    assert storage.read(S, 2).entry == real[2]
    assert storage.read(S, 4).code == pb.OK


def test_the_same_entry_again_and_entries_above_the_lac_are_stored(
    storage: StreamStorage,
) -> None:
    real = acknowledged(storage, 4, lac=1)
    outcome = storage.add_batch(add_request(S, 1, [real[1], entry(S, 2, b"rewritten")], lac=1))
    wait(outcome.durable)
    assert outcome.codes == [pb.OK, pb.OK] and not outcome.refused_overwrite
    assert storage.read(S, 2).entry.payload == b"rewritten"


def test_a_truncate_noop_written_back_as_a_plain_noop(storage: StreamStorage) -> None:
    acknowledged(storage, 2, lac=1)
    noop = entry(S, 2, b"", flags=NOOP_TRUNCATE)
    wait(storage.add_batch(add_request(S, 1, [noop])).durable)
    wait(storage.add_batch(add_request(S, 2, [entry(S, 3)], lac=3, lafr=3)).durable)
    plain = entry(S, 2, b"", flags=NOOP)
    outcome = storage.add_batch(add_request(S, 3, [plain], recovery=True))
    wait(outcome.durable)
    assert outcome.codes == [pb.OK]
    assert storage.read(S, 2).entry == plain
    assert storage.read(S, 3).code == pb.OK  # the acknowledged entry after it stays


def test_a_truncate_entry_below_the_lac_deletes_nothing(storage: StreamStorage) -> None:
    real = acknowledged(storage, 4, lac=3)
    truncate = entry(S, 1, b"", flags=NOOP_TRUNCATE)
    outcome = storage.add_batch(add_request(S, 1, [truncate], recovery=True))
    assert outcome.codes == [pb.BAD_REQUEST]
    assert "would delete acknowledged entries" in outcome.refused_overwrite
    assert [storage.read(S, i).entry for i in range(4)] == real
    assert storage.stream_state(S).last_entry_id == 3


def test_the_test_only_switch_lets_the_forgery_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UNSAFE_SKIP_ENV, "overwrite_check")
    storage, _ = open_storage(make_config(tmp_path))
    try:
        acknowledged(storage, 4, lac=3)
        forged = entry(S, 2, b"FORGED")
        wait(storage.add_batch(add_request(S, 1, [forged], lac=3)).durable)
        assert storage.read(S, 2).entry == forged
    finally:
        storage.close()
