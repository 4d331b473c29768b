"""The term rule in StreamStorage: lower terms refused, higher terms recorded durably (and
surviving a crash), fences creating streams, recovery reads, limbo."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream.wire import bookie_pb2 as pb

from .storage_support import (
    add_request,
    crash_and_reopen,
    entry,
    make_config,
    open_storage,
    wait,
)


@pytest.fixture(params=[True, False], ids=["journal", "no-journal"])
def config(request: pytest.FixtureRequest, tmp_path: Path):
    return make_config(tmp_path, journal_write_data=request.param)


def test_lower_term_is_refused_with_bookie_term(config) -> None:
    storage, _ = open_storage(config)
    try:
        wait(storage.add_batch(add_request(7, 3, [entry(7, 0)])).durable)
        outcome = storage.add_batch(add_request(7, 2, [entry(7, 1), entry(7, 2)]))
        assert outcome.codes == [pb.INVALID_TERM] * 2
        assert outcome.bookie_term == 3
        assert outcome.durable is None
        assert storage.read(7, 1).code == pb.NO_SUCH_ENTRY
        assert storage.fence(7, 2).code == pb.INVALID_TERM
        assert storage.truncate(7, 2, -1).code == pb.INVALID_TERM
        assert storage.read(7, 0, term=2).code == pb.INVALID_TERM
        assert storage.read(7, 0).entry is not None  # nothing was truncated
    finally:
        storage.close()


def test_higher_term_is_recorded_durably_and_survives_a_crash(config) -> None:
    storage, _ = open_storage(config)
    outcome = storage.add_batch(add_request(7, 1, [entry(7, 0)]))
    assert outcome.durable is not None  # a new term always waits for the journal
    wait(outcome.durable)
    outcome = storage.add_batch(add_request(7, 5, [entry(7, 1)]))
    assert outcome.bookie_term == 5
    wait(outcome.durable)
    fence = storage.fence(9, 4)  # a stream never seen: the fence creates it
    assert (fence.code, fence.bookie_term, fence.lac, fence.last_entry_id) == (pb.OK, 4, -1, -1)
    wait(fence.durable)
    read = storage.read(7, 0, term=6)  # a recovery read with a newer term
    assert read.code == pb.OK
    wait(read.durable)
    storage, report = crash_and_reopen(storage, config)
    try:
        assert report.unclean
        assert storage.stream_state(7).term == 6
        assert storage.stream_state(9).term == 4
        assert storage.add_batch(add_request(7, 5, [entry(7, 2)])).codes == [pb.INVALID_TERM]
        assert storage.fence(9, 3).code == pb.INVALID_TERM
    finally:
        storage.close()


def test_fence_reports_stream_end(config) -> None:
    storage, _ = open_storage(config)
    try:
        wait(storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(6)], lac=3)).durable)
        fence = storage.fence(7, 1)  # same term: served, nothing to record
        assert fence.durable is None
        assert (fence.code, fence.lac, fence.last_entry_id, fence.limbo) == (pb.OK, 3, 5, False)
        fence = storage.fence(7, 2)
        assert fence.bookie_term == 2
        wait(fence.durable)
        assert storage.add_batch(add_request(7, 1, [entry(7, 6)])).codes == [pb.INVALID_TERM]
        assert storage.fence(7, 0).code == pb.BAD_REQUEST
        assert storage.fence(0, 1).code == pb.BAD_REQUEST
    finally:
        storage.close()


def test_recovery_read_of_unknown_stream_records_its_term(config) -> None:
    # The TLA+ spec fences on recovery reads: a bookie that never saw the stream records the
    # reader's term (durably) and answers an explicit negative.
    storage, _ = open_storage(config)
    read = storage.read(11, 0, term=3)
    assert (read.code, read.bookie_term) == (pb.NO_SUCH_ENTRY, 3)
    assert read.durable is not None
    wait(read.durable)
    assert storage.read(12, 0).code == pb.NO_SUCH_STREAM  # a normal read records nothing
    assert storage.stream_state(12) is None
    storage, _ = crash_and_reopen(storage, config)
    try:
        assert storage.stream_state(11).term == 3
        assert storage.add_batch(add_request(11, 2, [entry(11, 0)])).codes == [pb.INVALID_TERM]
    finally:
        storage.close()


def test_record_term_creates_the_stream_durably_and_never_lowers_it(config) -> None:
    storage, _ = open_storage(config)
    wait(storage.record_term(21, 4))
    wait(storage.record_term(22, 0))  # a stream no writer opened yet: known, term 0
    wait(storage.add_batch(add_request(23, 6, [entry(23, 0)])).durable)
    wait(storage.record_term(23, 5))
    storage, _ = crash_and_reopen(storage, config)
    try:
        assert storage.stream_state(21).term == 4
        assert storage.stream_state(22).term == 0
        assert storage.stream_state(23).term == 6
        assert storage.knows(21) and storage.knows(22) and not storage.knows(24)
        assert storage.fence(21, 3).code == pb.INVALID_TERM
    finally:
        storage.close()


def test_limbo_turns_explicit_negatives_into_unknown(config) -> None:
    storage, _ = open_storage(config)
    wait(storage.add_batch(add_request(7, 1, [entry(7, 0), entry(7, 1)])).durable)
    wait(storage.set_limbo(7, True, term=4))
    wait(storage.set_limbo(8, True))  # a stream never seen gets a state in limbo
    state = storage.stream_state(7)
    assert (state.limbo, state.term) == (True, 4)
    assert storage.read(7, 0).code == pb.OK  # positives are served
    assert storage.read(7, 5).code == pb.UNKNOWN
    assert storage.read(8, 0).code == pb.UNKNOWN
    assert list(storage.read_range(7, 0, 3, 0))[-1][0] == pb.UNKNOWN
    assert storage.stats()["limbo_streams"] == 2
    storage, _ = crash_and_reopen(storage, config)
    try:
        assert storage.stream_state(7).limbo
        assert storage.read(7, 5).code == pb.UNKNOWN
        wait(storage.set_limbo(7, False))
        assert storage.read(7, 5).code == pb.NO_SUCH_ENTRY
        assert storage.stream_state(7).term == 4
        assert storage.stats()["limbo_streams"] == 1
    finally:
        storage.close()
    storage, report = open_storage(config)
    try:
        assert not report.unclean
        assert not storage.stream_state(7).limbo
        assert storage.stream_state(8).limbo
    finally:
        storage.close()


def test_recovery_adds_follow_the_term_rule(config) -> None:
    storage, _ = open_storage(config)
    try:
        wait(storage.fence(7, 2).durable)
        request = add_request(7, 2, [entry(7, 0)])
        request.recovery = True
        assert storage.add_batch(request).codes == [pb.OK]
        request = add_request(7, 1, [entry(7, 1)])
        request.recovery = True
        assert storage.add_batch(request).codes == [pb.INVALID_TERM]
    finally:
        storage.close()


def test_unclean_bit(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    storage, report = open_storage(config)
    assert not report.unclean and not storage.unclean_shutdown_detected
    storage.close()
    storage, report = open_storage(config)
    assert not report.unclean
    storage, report = crash_and_reopen(storage, config)
    assert report.unclean and storage.unclean_shutdown_detected
    storage.close()
    storage, report = open_storage(config)
    assert not report.unclean
    storage.close()
