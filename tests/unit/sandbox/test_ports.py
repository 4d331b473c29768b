"""The sandbox's port allocator: distinct ports, outside the kernel's ephemeral range, bindable."""

from __future__ import annotations

import socket

from stream.sandbox import ports


def test_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    low, high = ports._ephemeral_range()
    chosen = [ports.free_port() for _ in range(300)]
    assert len(set(chosen)) == len(chosen)
    assert all(not low <= p <= high for p in chosen)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", chosen[-1]))


def _kernel_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_busy_port_and_a_port_handed_out_before_are_skipped(monkeypatch) -> None:
    first, second = _kernel_free_port(), _kernel_free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        busy = held.getsockname()[1]
        picks = iter([busy, first, busy, first, second])
        monkeypatch.setattr(ports.random, "choice", lambda _: next(picks))
        monkeypatch.setattr(ports, "_handed_out", set())
        assert ports.free_port() == first
        assert ports.free_port() == second
