"""The chaos harness's hosts and ZooKeeper ensemble on real namespaces and processes: hosts
reach each other over the bridge, a partition cuts exactly the pair it names and heals, closing
the network removes every namespace, link and process (also after a failure), and a
three-server ensemble in namespaces elects a new leader when its leader is killed."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from stream.sandbox.netns import Host, Network, unavailable_reason
from stream.sandbox.zookeeper import ZooKeeperEnsemble

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

_UNAVAILABLE = unavailable_reason()
if _UNAVAILABLE:
    pytest.skip(f"chaos tests need network namespaces: {_UNAVAILABLE}", allow_module_level=True)

_PORT = 7000


def _until(condition: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def _listen(host: Host) -> subprocess.Popen[bytes]:
    """An echo-less TCP listener on the host: accepting is all a connect needs."""
    code = (
        "import socket,time\n"
        f"s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('{host.address}', {_PORT})); s.listen(64)\n"
        "while True: s.accept()\n"
    )
    return host.popen([sys.executable, "-c", code])


def _connects(source: Host, target: Host) -> bool:
    probe = f"import socket; socket.create_connection(('{target.address}', {_PORT}), timeout=1)"
    done = subprocess.run([*source.command_prefix, sys.executable, "-c", probe], check=False,
                          capture_output=True)  # fmt: skip
    return done.returncode == 0


def _root_connects(target: Host) -> bool:
    try:
        socket.create_connection((target.address, _PORT), timeout=1).close()
        return True
    except OSError:
        return False


def test_a_partition_cuts_the_named_hosts_and_heals() -> None:
    with Network() as network:
        a, b, c = (network.add_host(name) for name in ("a", "b", "c"))
        for host in (a, b, c):
            _listen(host)
        assert _until(lambda: _connects(a, b) and _connects(b, c) and _root_connects(a))
        network.partition([a], [b])
        assert not _connects(a, b) and not _connects(b, a)
        assert _connects(a, c) and _connects(c, b) and _root_connects(a)
        network.heal()
        assert _connects(a, b) and _connects(b, a)


def _leftovers(network: Network) -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [
        word
        for word in (names + links).replace(":", " ").replace("@", " ").split()
        if network.token in word
    ]


def test_closing_the_network_removes_namespaces_links_and_processes_after_a_failure() -> None:
    network = Network()
    processes: list[subprocess.Popen[bytes]] = []
    with pytest.raises(RuntimeError), network:
        for name in ("x", "y"):
            processes.append(network.add_host(name).popen(["sleep", "600"]))
        assert _leftovers(network)
        raise RuntimeError("a test failing mid-way")
    assert all(process.poll() is not None for process in processes)
    assert _leftovers(network) == []


def test_an_ensemble_in_namespaces_survives_its_leader_being_killed(tmp_path: Path) -> None:
    with Network() as network:
        hosts = [network.add_host(f"zk{i}") for i in (1, 2, 3)]
        ensemble = ZooKeeperEnsemble(
            tmp_path, 3, hosts=[(h.address, h.command_prefix) for h in hosts]
        )
        with ensemble:
            assert ensemble.hosts == ",".join(f"{h.address}:2181" for h in hosts)
            leader = ensemble.leader()
            assert leader is not None
            zk = KazooClient(hosts=ensemble.hosts)
            zk.start(timeout=20)
            try:
                zk.create("/before", b"1")
                leader.kill9()
                assert _until(lambda: ensemble.leader() not in (None, leader), 30)
                zk.retry(zk.create, "/after", b"2")
                assert zk.retry(zk.get, "/before")[0] == b"1"
            finally:
                zk.stop()
                zk.close()
