"""`AppendFuture` behaves like a `concurrent.futures.Future` from any thread."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from stream.client.futures import AppendFuture


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
