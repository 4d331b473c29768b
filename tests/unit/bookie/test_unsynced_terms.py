"""A request of a stream's new term, served while another request's record of that term waits
for the journal sync, waits for that sync too: the bookie raised the term in memory at once,
and must not answer with a term a crash could take back (docs/design.md §4; found by the
simulator's `bookie-terms` oracle, seed 167). Test-only switch: `unsynced_term`."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from stream.bookie.config import BookieConfig
from stream.bookie.core import BookieCore
from stream.bookie.server import StartReport
from stream.bookie.storage import StreamStorage
from stream.bookie.unsafe import SAFE, UnsafeSkips
from stream.sim.disk import SimDisk
from stream.sim.loop import run_simulated
from stream.wire import bookie_pb2 as pb

from .test_server import add

_START = StartReport(unclean_start=False, replayed_records=0, replayed_entries=0)


def _answered_before_the_sync(journal_write_data: bool, unsafe: UnsafeSkips) -> list[str]:
    """Returns which requests of term 3 were answered before the sync of the term record that
    a first fence of term 3 appended."""
    config = BookieConfig(
        bookie_id="b1",
        listen="127.0.0.1:1",
        metadata="127.0.0.1:2181/x",
        data_dir="/sim/b1",
        journal_write_data=journal_write_data,
    )

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        storage = StreamStorage(
            config, disk=SimDisk(random.Random(1)), clock=loop.time, threads=False, unsafe=unsafe
        )
        storage.open()
        core = BookieCore(config, storage, instance_id="i", start_report=_START)
        first = asyncio.ensure_future(core.add(add(1, 2, range(3), lac=-1)))
        await asyncio.sleep(0)
        storage.commit_journal()
        assert list((await first).codes) == [pb.OK] * 3
        raising = asyncio.ensure_future(core.fence(pb.FenceRequest(stream_id=1, term=3)))
        await asyncio.sleep(0)  # term 3 is in memory, its journal record not synced
        later: dict[str, asyncio.Future[Any]] = {
            "fence": asyncio.ensure_future(core.fence(pb.FenceRequest(stream_id=1, term=3))),
            "recovery read": asyncio.ensure_future(
                core.read(pb.ReadRequest(stream_id=1, entry_id=1, term=3))
            ),
            "lac-only add": asyncio.ensure_future(core.add(add(1, 3, range(0), lac=2))),
        }
        await asyncio.sleep(0.01)
        early = [name for name, answer in later.items() if answer.done()]
        assert not raising.done()
        storage.commit_journal()
        for answer in [raising, *later.values()]:
            await answer
        storage.close()
        return early

    return run_simulated(main())


@pytest.mark.parametrize("journal_write_data", [True, False])
def test_requests_of_a_new_term_wait_for_its_journal_sync(journal_write_data: bool) -> None:
    assert _answered_before_the_sync(journal_write_data, SAFE) == []


def test_the_switch_answers_them_before_the_sync() -> None:
    early = _answered_before_the_sync(False, UnsafeSkips(frozenset({"unsynced_term"})))
    assert early == ["fence", "recovery read", "lac-only add"]
