"""The journal's group commits on the event loop (`journal_thread = false`, `LoopCommits`):
no journal thread, the batches of one loop turn in one group, a flush's checkpoint committed by
the loop, and a storage closed while its flusher waits for the loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from stream.bookie.storage import ReplayReport, StreamStorage
from stream.bookie.storage.loop_commits import LoopCommits
from stream.wire import bookie_pb2 as pb

from .storage_support import (
    TIMEOUT_S,
    add_request,
    entry,
    make_config,
    open_storage,
    wait_until,
)


def _on_loop(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Runs `test` on a new event loop in a thread of its own and fails when it does not end
    in time (a storage waiting for a commit nobody makes hangs instead of failing)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(test())
        except BaseException as e:
            failure.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(TIMEOUT_S)
    assert not thread.is_alive(), "the event loop hung"
    if failure:
        raise failure[0]


def _open_on_loop(path: Path) -> tuple[StreamStorage, ReplayReport]:
    storage = StreamStorage(make_config(path), journal_loop=asyncio.get_running_loop())
    return storage, storage.open()


async def _five_durable_entries(storage: StreamStorage) -> None:
    outcome = storage.add_batch(add_request(7, 1, [entry(7, i) for i in range(5)]))
    assert outcome.durable is not None
    await asyncio.wrap_future(outcome.durable)


def _reopened_with_five_entries(path: Path) -> ReplayReport:
    """Opens the storage under `path` again (with a journal thread); checks that stream 7's
    five entries read back; returns what the replay found."""
    reopened, report = open_storage(make_config(path))
    try:
        assert [reopened.read(7, i).code for i in range(5)] == [pb.OK] * 5
    finally:
        reopened.close()
    return report


def test_the_loop_commits_the_batches_of_one_turn_as_one_group(tmp_path: Path) -> None:
    async def test() -> None:
        threads_before = threading.active_count()
        storage, _ = _open_on_loop(tmp_path)
        # The flusher and GC threads, no journal thread.
        assert threading.active_count() == threads_before + 2
        first = storage.add_batch(add_request(7, 1, [entry(7, 0), entry(7, 1)]))
        second = storage.add_batch(add_request(8, 1, [entry(8, 0)]))
        assert first.codes == [pb.OK, pb.OK] and second.codes == [pb.OK]
        assert first.durable is not None and first.durable is second.durable
        assert not first.durable.done()  # committed between the loop's turns, not inline
        await asyncio.wrap_future(first.durable)
        third = storage.add_batch(add_request(7, 1, [entry(7, 2)], lac=1))
        assert third.durable is not None and third.durable is not first.durable
        await asyncio.wrap_future(third.durable)
        storage.close()
        reopened, report = open_storage(make_config(tmp_path))
        try:
            assert reopened.lac(7) is not None
            assert [reopened.read(7, i).code for i in range(3)] == [pb.OK] * 3
            assert reopened.read(8, 0).code == pb.OK
            assert not report.unclean
        finally:
            reopened.close()

    _on_loop(test)


def test_a_flush_on_its_thread_gets_its_checkpoint_committed_by_the_loop(
    tmp_path: Path,
) -> None:
    async def test() -> None:
        storage, _ = _open_on_loop(tmp_path)
        await _five_durable_entries(storage)
        await asyncio.wrap_future(storage.request_flush())
        # Everything before the checkpoint is flushed: after a crash nothing is replayed.
        storage.abandon()
        assert _reopened_with_five_entries(tmp_path).entries_replayed == 0

    _on_loop(test)


def test_closing_while_the_flusher_waits_for_the_loop_does_not_hang(tmp_path: Path) -> None:
    async def test() -> None:
        storage, _ = _open_on_loop(tmp_path)
        await _five_durable_entries(storage)
        flushed = storage.request_flush()
        # The loop does not turn: the flusher takes its snapshot and its mark, writes the
        # entry logs and waits for the mark's commit, which the loop has not made when
        # close() stops the threads.
        wait_until(lambda: storage.stats()["entry_log_bytes_written"] != 0)
        assert not flushed.done()
        storage.close()
        assert flushed.result(timeout=0) is None
        report = _reopened_with_five_entries(tmp_path)
        assert report.records_replayed == 0 and not report.unclean

    _on_loop(test)


def test_a_commit_scheduled_from_another_thread_runs_on_the_loop(tmp_path: Path) -> None:
    async def test() -> None:
        loop = asyncio.get_running_loop()
        commits: list[int] = []

        class Journal:
            def commit_pending(self) -> bool:
                commits.append(threading.get_ident())
                if len(commits) == 1:
                    # A record appended once this commit took the pending ones (a mark, on
                    # the flusher's thread) starts a group that needs a commit of its own.
                    scheduler.schedule()
                return True

        scheduler = LoopCommits(Journal(), loop)  # type: ignore[arg-type]
        scheduler.schedule()
        scheduler.schedule()  # one commit is scheduled and has not started: nothing more
        await asyncio.to_thread(scheduler.schedule)
        for _ in range(4):
            await asyncio.sleep(0)
        assert commits == [threading.get_ident()] * 2
        assert not await asyncio.to_thread(scheduler.here) and scheduler.here()
        await asyncio.to_thread(scheduler.schedule)
        for _ in range(4):
            await asyncio.sleep(0)
        assert commits == [threading.get_ident()] * 3

    _on_loop(test)
