"""`AppendFuture` behaves like a `concurrent.futures.Future` from any thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

import pytest

from stream.client.futures import AppendFuture, set_results


def test_result_set_before_anyone_waits() -> None:
    future: AppendFuture[int] = AppendFuture()
    assert future.running() and not future.done()
    assert not future.cancel()  # queued appends cannot be cancelled
    future.set_result(7)
    assert future.done() and future.result(timeout=0) == 7
    with pytest.raises(concurrent.futures.InvalidStateError):
        future.set_result(8)


def test_waiters_in_other_threads_are_woken() -> None:
    futures: list[AppendFuture[int]] = [AppendFuture() for _ in range(200)]
    got: list[int] = []
    waiting = threading.Barrier(5)

    def wait_all(part: list[AppendFuture[int]]) -> None:
        waiting.wait()
        got.extend(f.result(timeout=10) for f in part)

    threads = [threading.Thread(target=wait_all, args=(futures[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    waiting.wait()
    for i, f in enumerate(futures):
        f.set_result(i)
    for t in threads:
        t.join(timeout=10)
    assert sorted(got) == list(range(200))


def test_callbacks_exceptions_and_wait_helpers() -> None:
    future: AppendFuture[int] = AppendFuture()
    seen: list[object] = []
    future.add_done_callback(lambda f: seen.append(f.exception()))
    error = ValueError("boom")
    future.set_exception(error)
    assert seen == [error]
    with pytest.raises(ValueError):
        future.result()
    late: AppendFuture[int] = AppendFuture()
    late.set_result(1)
    late.add_done_callback(lambda f: seen.append(f.result()))
    assert seen[-1] == 1
    pending: AppendFuture[int] = AppendFuture()
    threading.Timer(0.05, pending.set_result, args=(2,)).start()
    done, _ = concurrent.futures.wait([pending, late], timeout=10)
    assert done == {pending, late}
    assert [f.result() for f in concurrent.futures.as_completed([pending])] == [2]
    with pytest.raises(concurrent.futures.TimeoutError):
        AppendFuture().result(timeout=0.01)


def test_callbacks_need_no_condition() -> None:
    """A callback registered before the result (a caller timing its appends) is called once at
    resolution, without the condition a waiter needs; one registered after is called at once;
    one that raises is logged and does not stop the others."""
    seen: list[tuple[str, object]] = []
    future: AppendFuture[int] = AppendFuture()
    future.add_done_callback(lambda f: seen.append(("first", f.result())))
    future.add_done_callback(lambda f: seen.append(("second", f.result())))
    assert future._cond is None and seen == []
    future.set_result(3)
    assert future._cond is None
    assert seen == [("first", 3), ("second", 3)]
    raising: AppendFuture[int] = AppendFuture()
    raising.add_done_callback(lambda f: 1 / 0)
    raising.add_done_callback(lambda f: seen.append(("after", f.result())))
    raising.set_result(5)
    assert seen[-1] == ("after", 5)
    future.add_done_callback(lambda f: seen.append(("late", f.result())))
    assert seen[-1] == ("late", 3)
    # A waiter arriving after a callback keeps it: the result reaches both.
    waited: AppendFuture[int] = AppendFuture()
    waited.add_done_callback(lambda f: seen.append(("waited", f.result())))
    threading.Timer(0.02, waited.set_result, args=(4,)).start()
    assert waited.result(timeout=10) == 4
    assert seen[-1] == ("waited", 4)
    failed: AppendFuture[int] = AppendFuture()
    failed.add_done_callback(lambda f: seen.append(("failed", f.exception())))
    error = ValueError("boom")
    failed.set_exception(error)
    assert seen[-1] == ("failed", error) and failed._cond is None


def test_callbacks_racing_resolution_run_once() -> None:
    """Callbacks registered from another thread while the futures resolve each run once."""
    futures: list[AppendFuture[int]] = [AppendFuture() for _ in range(2000)]
    calls: list[int] = []
    lock = threading.Lock()

    def count(f: concurrent.futures.Future[int]) -> None:
        with lock:
            calls.append(f.result())

    registering = threading.Thread(target=lambda: [f.add_done_callback(count) for f in futures])
    registering.start()
    for i, f in enumerate(futures):
        f.set_result(i)
    registering.join(timeout=10)
    assert sorted(calls) == list(range(2000))


def test_a_run_resolves_in_order_once_like_set_result_on_each() -> None:
    """`set_results` (an answer's appends at once): fresh futures, one with a waiter in
    another thread, ones with callbacks, an asyncio future and a cancelled one; each gets
    its id once, callbacks run once and see the result, the waiter wakes."""
    loop = asyncio.new_event_loop()
    try:
        futures: list[Any] = [AppendFuture() for _ in range(6)]
        awaited, cancelled = loop.create_future(), loop.create_future()
        cancelled.cancel()
        futures[3:3] = [awaited, cancelled]
        seen: list[tuple[int, int]] = []
        futures[1].add_done_callback(lambda f: seen.append((1, f.result())))
        futures[1].add_done_callback(lambda f: seen.append((11, f.result())))
        futures[6].add_done_callback(lambda f: seen.append((6, f.result())))
        woken: list[int] = []
        waiter = threading.Thread(target=lambda: woken.append(futures[2].result(timeout=10)))
        waiter.start()
        while futures[2]._cond is None:  # the waiter built the condition
            threading.Event().wait(0.001)
        set_results(iter(futures), 40)
        waiter.join(timeout=10)
        assert woken == [42]
        assert [f.result() for f in futures if f is not cancelled] == [40, 41, 42, 43, 45, 46, 47]
        assert cancelled.cancelled()
        assert seen == [(1, 41), (11, 41), (6, 46)]
        with pytest.raises(concurrent.futures.InvalidStateError):
            futures[0].set_result(0)
        set_results(futures[:1], 7)  # already done: left as it is
        assert futures[0].result() == 40
    finally:
        loop.close()


def test_a_second_resolution_of_a_fresh_future_raises() -> None:
    """Resolving twice a future nobody waited on raises, as a Future does (it deadlocked:
    the error's message took the future's lock while it was held); in a thread, so that a
    deadlock fails the test instead of hanging it."""
    future: AppendFuture[int] = AppendFuture()
    future.set_result(1)
    refused: list[str] = []

    resolutions: list[tuple[str, Callable[[], None]]] = [
        ("result", lambda: future.set_result(2)),
        ("exception", lambda: future.set_exception(ValueError("late"))),
    ]

    def again() -> None:
        for name, resolve in resolutions:
            try:
                resolve()
            except concurrent.futures.InvalidStateError:
                refused.append(name)

    thread = threading.Thread(target=again, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert refused == ["result", "exception"]
    assert future.result() == 1
