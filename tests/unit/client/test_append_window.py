"""The writer's append window: tickets enter while below completed + size, acknowledgments
resolve futures in id order and free room, failures fail every queued and unresolved append
once (a future already cancelled is skipped)."""

from __future__ import annotations

import asyncio

import pytest

from stream.client.append_window import AppendWindow
from stream.errors import StreamError


def test_acknowledgments_resolve_in_id_order_and_free_room() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        window = AppendWindow(3)
        tickets = [next(window.tickets) for _ in range(4)]
        assert [window.has_room(t) for t in tickets] == [True, True, True, False]
        futures = [loop.create_future() for _ in range(3)]
        window.unresolved.extend(futures)
        window.unresolved_first_id = 50
        window.resolve(51)  # entries 50 and 51 acknowledged
        assert [f.result() for f in futures[:2]] == [50, 51]
        assert not futures[2].done()
        assert window.has_room(tickets[3]) and window.unresolved_first_id == 52
        window.resolve(51)  # again: nothing more
        assert window.completed == 2

    asyncio.run(run())


def test_a_task_waiting_for_room_enters_once_an_append_completes() -> None:
    async def run() -> None:
        window = AppendWindow(1)
        next(window.tickets)
        waiting = asyncio.ensure_future(window.wait_room(next(window.tickets), lambda: None))
        await asyncio.sleep(0)
        assert not waiting.done()
        window.completed_appends(1)
        await asyncio.wait_for(waiting, 1)

    asyncio.run(run())


def test_failures_fail_each_append_once_and_count_it_done() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        window = AppendWindow(8)
        queued = [loop.create_future() for _ in range(2)]
        unresolved = [loop.create_future() for _ in range(3)]
        window.queue.extend((b"x", f) for f in queued)
        window.unresolved.extend(unresolved)
        unresolved[1].cancel()  # its caller gave up: skipped, still counted
        error = StreamError("stopped", stream="s")
        window.fail_unresolved(error)
        window.fail_queued(error)
        assert window.completed == 5
        assert not window.queue and not window.unresolved
        for future in (*queued, unresolved[0], unresolved[2]):
            assert future.exception() is error
        with pytest.raises(StreamError):
            await window.wait_answered(lambda: (_ for _ in ()).throw(error))

    asyncio.run(run())
