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
