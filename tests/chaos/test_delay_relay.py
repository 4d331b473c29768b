"""The delay relay (where the kernel has no `tc netem`): connections to a host go through it
with the client's address kept (partitions still cut them), and while a host is delayed,
messages sent in order on two connections arrive out of order."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from stream.sandbox.chaos.relay import Delay, DelayRelays
from stream.sandbox.netns import Host, Network, unavailable_reason

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

_UNAVAILABLE = unavailable_reason()
if _UNAVAILABLE:
    pytest.skip(f"chaos tests need network namespaces: {_UNAVAILABLE}", allow_module_level=True)

_PORT = 7000
_ROUNDS = 30

# One thread, one selector: lines are logged in the order they reach the server.
_SERVER = """
import selectors, socket, sys
log = open(sys.argv[2], "a", buffering=1)
server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], int(sys.argv[3]))); server.listen(64)
selector = selectors.DefaultSelector(); selector.register(server, selectors.EVENT_READ)
while True:
    for key, _ in selector.select():
        if key.fileobj is server:
            selector.register(server.accept()[0], selectors.EVENT_READ)
            continue
        data = key.fileobj.recv(4096)
        if not data:
            selector.unregister(key.fileobj); key.fileobj.close()
        for line in data.decode().split():
            log.write(line + "\\n")
"""

# Sends round i on the first connection, then on the second; a pause keeps the rounds apart.
# A refused connection is tried again until the timeout: the server, started just before, may
# not listen yet.
_CLIENT = """
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[2])
def connect():
    while True:
        try:
            address = (sys.argv[1], int(sys.argv[3]))
            return socket.create_connection(address, timeout=float(sys.argv[2]))
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
first = connect()
second = connect()
for i in range(int(sys.argv[4])):
    first.sendall(f"{i}-first ".encode()); second.sendall(f"{i}-second ".encode())
    time.sleep(0.01)
first.close(); second.close()
"""


def _send(
    source: Host, target: Host, timeout_s: float = 10.0, rounds: int = _ROUNDS
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*source.command_prefix, sys.executable, "-c", _CLIENT, target.address, str(timeout_s),
         str(_PORT), str(rounds)],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip


def _inversions(log: Path) -> int:
    """Rounds whose second-connection line arrived before its first-connection line."""
    order = log.read_text().split()
    return sum(order.index(f"{i}-second") < order.index(f"{i}-first") for i in range(_ROUNDS))


def _wait_logged(log: Path, count: int) -> None:
    deadline = time.monotonic() + 30
    while not (log.exists() and len(log.read_text().split()) >= count):
        assert time.monotonic() < deadline, "the server did not log every line"
        time.sleep(0.05)


def test_delayed_connections_overtake_each_other_and_partitions_still_apply(
    tmp_path: Path,
) -> None:
    with Network() as network:
        a, b, c = (network.add_host(name) for name in ("a", "b", "c"))
        relays = DelayRelays(tmp_path / "delay.json")
        relays.start(b, tmp_path / "relay.log")
        log = tmp_path / "arrivals.log"
        b.popen([sys.executable, "-c", _SERVER, b.address, str(log), str(_PORT)])
        # Until the server listens, the relay accepts a delayed host's connection and closes
        # it (its own connect refused): wait for the server from an undelayed host first.
        assert _send(c, b, rounds=0).returncode == 0

        relays.delay([a], Delay(delay_ms=40.0, jitter_ms=30.0, seed=1))
        assert _send(a, b).returncode == 0
        _wait_logged(log, 2 * _ROUNDS)
        assert _inversions(log) > 0, log.read_text()

        network.partition([a], [b])
        assert (
            _send(a, b, timeout_s=2.0).returncode != 0
        )  # the relay keeps the address the rules cut
        assert _send(c, b).returncode == 0
