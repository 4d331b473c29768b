"""Model test: random sequences of add / truncate / trim / fence / flush / crash-reopen against
a dict model. Every acknowledged entry that was not truncated or trimmed reads back with the
same bytes, and nothing else does.

The model keeps what reads show now (`live`) and what survives a crash (`durable`). With the
journal an acknowledged add is durable; without it only a flush makes entries durable. Adds
whose durability future has not completed at a crash may or may not come back."""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import Future
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from stream.bookie.storage import StreamStorage
from stream.wire import bookie_pb2 as pb

from .storage_support import add_request, entry, make_config, open_storage, wait

STREAM = 7
MAX_ID = 30


class StorageModel(RuleBasedStateMachine):
    journal_write_data = True

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="storage-model-"))
        self.config = make_config(
            self.dir,
            journal_write_data=self.journal_write_data,
            entry_log_size_limit_bytes=70 << 10,
            max_entry_bytes=1024,
        )
        self.storage: StreamStorage = open_storage(self.config)[0]
        self.live: dict[int, bytes] = {}
        self.durable: dict[int, bytes] = {}
        self.first = 0
        self.term = 1
        # The last Truncate applied (term, after): term 0, none.
        self.truncated = (0, -1)
        self.writes = 0
        # Adds not yet known durable: (entry id -> payload, future) in order.
        self.pending: list[tuple[dict[int, bytes], Future[None]]] = []

    def teardown(self) -> None:
        self.storage.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _payload(self, entry_id: int) -> bytes:
        self.writes += 1
        return f"w{self.writes}-e{entry_id}-".encode() * (1 + self.writes % 20)

    def _settle(self) -> None:
        """Everything before an awaited request is durable: group commits are in order."""
        for written, fut in self.pending:
            wait(fut)
            if self.journal_write_data:
                self.durable.update(written)
        self.pending = []

    @rule(
        start=st.integers(0, MAX_ID),
        count=st.integers(0, 8),
        await_it=st.booleans(),
    )
    def add(self, start: int, count: int, await_it: bool) -> None:
        ids = [i for i in range(start, min(start + count, MAX_ID + 1)) if i >= self.first]
        payloads = {i: self._payload(i) for i in ids}
        entries = [entry(STREAM, i, payloads[i]) for i in ids]
        outcome = self.storage.add_batch(add_request(STREAM, self.term, entries))
        assert outcome.codes == ([pb.OK] * len(ids) or [pb.OK])
        self.live.update(payloads)
        if outcome.durable is not None:
            self.pending.append((payloads, outcome.durable))
        if await_it:
            self._settle()

    @rule(after=st.integers(-1, MAX_ID))
    def truncate(self, after: int) -> None:
        outcome = self.storage.truncate(STREAM, self.term, after)
        applied_term, applied_after = self.truncated
        if self.term == applied_term and after <= applied_after:
            # A late Truncate of the same term deletes nothing (stream.protocol.truncation).
            assert outcome.code == (pb.OK if after == applied_after else pb.BAD_REQUEST)
            return
        assert outcome.code == pb.OK
        self.truncated = (self.term, after)
        wait(outcome.durable)
        self._settle()
        for model in (self.live, self.durable):
            for entry_id in [i for i in model if i > after]:
                del model[entry_id]

    @rule(term_step=st.integers(0, 2), truncate_at=st.one_of(st.none(), st.integers(0, MAX_ID)))
    def new_term(self, term_step: int, truncate_at: int | None) -> None:
        """A takeover: fence with a newer term, optionally ending with a TRUNCATE no-op."""
        fence = self.storage.fence(STREAM, self.term + term_step)
        assert fence.code == pb.OK
        wait(fence.durable)
        self._settle()
        self.term += term_step
        if truncate_at is not None and truncate_at >= self.first:
            noop = entry(STREAM, truncate_at, b"", flags=pb.NOOP | pb.TRUNCATE)
            outcome = self.storage.add_batch(add_request(STREAM, self.term, [noop]))
            assert outcome.codes == [pb.OK]
            wait(outcome.durable)
            for model in (self.live, self.durable):
                for entry_id in [i for i in model if i > truncate_at]:
                    del model[entry_id]
            # Journal or not, the no-op itself is journaled (it may overwrite a flushed value).
            self.live[truncate_at] = b""
            self.durable[truncate_at] = b""

    @rule(before=st.integers(0, MAX_ID + 1))
    def trim(self, before: int) -> None:
        if self.storage.stream_state(STREAM) is None:
            return
        outcome = self.storage.trim(STREAM, before)
        assert outcome.code == pb.OK
        wait(outcome.durable)
        self._settle()
        self.first = max(self.first, before)
        assert outcome.first_entry_id == self.first
        for model in (self.live, self.durable):
            for entry_id in [i for i in model if i < self.first]:
                del model[entry_id]

    @rule()
    def flush(self) -> None:
        self._settle()
        wait(self.storage.request_flush())
        self.durable = dict(self.live)

    @rule()
    def gc(self) -> None:
        self.storage.gc_once()
        self.storage.compact_once(0.8)

    @rule()
    def crash(self) -> None:
        uncertain = {}
        for written, fut in self.pending:
            if fut.done() and fut.exception() is None and self.journal_write_data:
                self.durable.update(written)
            else:
                uncertain.update(written)
        self.pending = []
        self.storage.abandon()
        self.storage, report = open_storage(self.config)
        assert report.unclean
        live = dict(self.durable)
        for entry_id, payload in uncertain.items():
            if entry_id < self.first:
                continue
            got = self.storage.read(STREAM, entry_id)
            if got.code == pb.OK and got.entry.payload == payload:
                live[entry_id] = payload  # the unacknowledged add made it
            else:
                expected = self.durable.get(entry_id)
                actual = got.entry.payload if got.code == pb.OK else None
                assert actual == expected, (entry_id, actual, expected, payload)
        self.live = live
        self.durable = dict(live) if self.journal_write_data else self.durable
        state = self.storage.stream_state(STREAM)
        if state is not None:
            assert state.term == self.term
            assert state.first_entry_id == self.first

    @invariant()
    def reads_match_the_model(self) -> None:
        for entry_id in range(MAX_ID + 1):
            got = self.storage.read(STREAM, entry_id)
            if self.storage.stream_state(STREAM) is None:
                assert got.code == pb.NO_SUCH_STREAM
            elif entry_id < self.first:
                assert got.code == pb.TRIMMED
            elif entry_id in self.live:
                assert got.code == pb.OK, (entry_id, got.code)
                assert got.entry.payload == self.live[entry_id]
            else:
                assert got.code == pb.NO_SUCH_ENTRY, (entry_id, got.code)
        if self.storage.stream_state(STREAM) is not None and self.first <= MAX_ID:
            ranged = [
                e
                for _, batch in self.storage.read_range(STREAM, self.first, MAX_ID, 500)
                for e in batch
            ]
            expected_ids = []
            for entry_id in range(self.first, MAX_ID + 1):
                if entry_id not in self.live:
                    break
                expected_ids.append(entry_id)
            assert [e.entry_id for e in ranged] == expected_ids


class StorageModelWithoutJournal(StorageModel):
    journal_write_data = False


# STORAGE_MODEL_EXAMPLES=2000 for a long hunt; the default keeps the unit suite fast.
_SETTINGS = settings(
    max_examples=int(os.environ.get("STORAGE_MODEL_EXAMPLES", "30")),
    stateful_step_count=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize(
    "machine", [StorageModel, StorageModelWithoutJournal], ids=["journal", "no-journal"]
)
def test_storage_matches_the_model(machine: type[StorageModel]) -> None:
    run_state_machine_as_test(machine, settings=_SETTINGS)
