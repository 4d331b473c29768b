"""Hosts on a private network: one Linux network namespace per host, each with a veth pair on a
bridge and its own address, for the chaos harness (real partitions and packet loss between real
processes). Needs root, `ip` (iproute2) and `nft` (nftables); `unavailable_reason()` says what is
missing. Every name carries a random token, so parallel runs do not collide, and `close()`
removes every namespace, link and process the network made, also after a failure."""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from stream.errors import StreamError
from stream.logs import get_logger

log = get_logger(__name__)

# The chaos networks live in 10.77.X.0/24; X is picked among those no interface uses yet.
_NETWORK_PREFIX = "10.77"

# Per-host nftables table: a set of blocked peers (a partition drops both directions, like a
# cut cable: connections hang rather than fail at once) and a chain for random loss.
_RULESET = """\
table inet chaos {
  set blocked { type ipv4_addr; }
  chain input { type filter hook input priority 0; policy accept; ip saddr @blocked drop; }
  chain output { type filter hook output priority 0; policy accept; ip daddr @blocked drop; }
  chain loss { type filter hook output priority 1; policy accept; }
}
"""


# Every TCP connection another host makes to this one goes to a local port instead (the chaos
# delay relay, where the kernel has no `tc netem`); the relay's own connections to the servers
# are local, so they are not redirected.
_REDIRECT = """\
table ip chaos_relay {{
  chain prerouting {{
    type nat hook prerouting priority -100; tcp dport != {port} redirect to :{port};
  }}
}}
"""


class NetnsError(StreamError):
    """A namespace, link or firewall command failed."""


def _run(argv: Sequence[str], *, stdin: str | None = None) -> str:
    result = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NetnsError(
            f"command failed: {' '.join(argv)}: {result.stderr.strip()}", code=result.returncode
        )
    return result.stdout


def unavailable_reason() -> str | None:
    """Returns why namespaces cannot be used here (None when they can): not root, `ip` or `nft`
    missing, or the kernel refusing a namespace."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (Debian package {package}: run scripts/setup.sh)"
    probe = f"skprobe{secrets.token_hex(3)}"
    try:
        _run(["ip", "netns", "add", probe])
        _run(["ip", "netns", "exec", probe, "nft", "-f", "-"], stdin=_RULESET)
    except NetnsError as e:
        return f"network namespaces are not usable here: {e}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def netem_available() -> bool:
    """Whether the kernel has `tc netem` (delay and reordering); some VM kernels lack it."""
    probe = f"skprobe{secrets.token_hex(3)}"
    try:
        _run(["ip", "netns", "add", probe])
        _run(["ip", "netns", "exec", probe, "ip", "link", "set", "lo", "up"])
        _run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem"])
        return True
    except NetnsError:
        return False
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)


def _used_subnets() -> set[str]:
    text = _run(["ip", "-4", "-o", "addr", "show"])
    return {
        ".".join(word.split("/")[0].split(".")[:3])
        for word in text.split()
        if word.startswith(_NETWORK_PREFIX + ".")
    }


class Host:
    """One network namespace with one address on the bridge. Processes run in it through
    `ip netns exec` (which execs: the Popen's pid is the process itself)."""

    def __init__(self, name: str, namespace: str, address: str, device: str) -> None:
        self.name = name
        self.namespace = namespace
        self.address = address
        self.device = device
        self.processes: list[subprocess.Popen[bytes]] = []

    def __repr__(self) -> str:
        return f"Host({self.name}, {self.address})"

    @property
    def command_prefix(self) -> list[str]:
        """What to put before a command to run it on this host."""
        return ["ip", "netns", "exec", self.namespace]

    def run(self, argv: Sequence[str], *, stdin: str | None = None) -> str:
        """Runs a short command on this host and returns its output; raises NetnsError."""
        return _run([*self.command_prefix, *argv], stdin=stdin)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Starts a long-running process on this host; `close()` of the network kills it."""
        process = subprocess.Popen([*self.command_prefix, *argv], **kwargs)
        self.processes.append(process)
        return process

    def block(self, addresses: Iterable[str]) -> None:
        """Drops every packet to and from `addresses` (one side of a partition)."""
        elements = ", ".join(sorted(set(addresses)))
        if elements:
            self.run(["nft", "add", "element", "inet", "chaos", "blocked", f"{{ {elements} }}"])

    def set_loss(self, percent: int) -> None:
        """Drops `percent` % of the packets this host sends, at random."""
        if not 0 < percent < 100:
            raise NetnsError("loss must be between 1 and 99 percent", percent=percent)
        self.run(
            [
                "nft",
                "add",
                "rule",
                "inet",
                "chaos",
                "loss",
                "numgen",
                "random",
                "mod",
                "100",
                "<",
                str(percent),
                "drop",
            ]  # fmt: skip
        )

    def set_netem(self, spec: Sequence[str]) -> None:
        """Puts a `tc netem` qdisc (e.g. delay 50ms 20ms reorder 25%) on the host's link."""
        self.run(["tc", "qdisc", "replace", "dev", self.device, "root", "netem", *spec])

    def redirect_tcp(self, port: int) -> None:
        """Sends every TCP connection from other hosts to local `port` (a transparent relay,
        which finds where each was going with `SO_ORIGINAL_DST`)."""
        self.run(["nft", "-f", "-"], stdin=_REDIRECT.format(port=port))

    def heal(self) -> None:
        """Removes every partition, loss rule and netem qdisc of this host."""
        self.run(["nft", "flush", "set", "inet", "chaos", "blocked"])
        self.run(["nft", "flush", "chain", "inet", "chaos", "loss"])
        subprocess.run(
            [*self.command_prefix, "tc", "qdisc", "del", "dev", self.device, "root"],
            capture_output=True,
            check=False,
        )

    def kill_all(self) -> None:
        """SIGKILLs every process in the namespace (started here or not) and reaps ours."""
        pids = subprocess.run(
            ["ip", "netns", "pids", self.namespace], capture_output=True, text=True, check=False
        ).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()


class Network:
    """A bridge in the root namespace (which keeps the first address, so the harness reaches
    every host) and the hosts added to it. Use as a context manager."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(3)
        self.bridge = f"skb{self.token}"
        self.hosts: dict[str, Host] = {}
        self._subnet: ipaddress.IPv4Network | None = None
        self._devices: list[str] = []

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge."""
        return str(self._network[1])

    @property
    def _network(self) -> ipaddress.IPv4Network:
        if self._subnet is None:
            raise NetnsError("network not started")
        return self._subnet

    def start(self) -> Network:
        used = _used_subnets()
        free = [x for x in range(1, 255) if f"{_NETWORK_PREFIX}.{x}" not in used]
        if not free:
            raise NetnsError("no free 10.77.X.0/24 subnet")
        x = free[secrets.randbelow(len(free))]
        self._subnet = ipaddress.IPv4Network(f"{_NETWORK_PREFIX}.{x}.0/24")
        try:
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])
        except BaseException:
            self.close()
            raise
        log.info("netns.network_started", bridge=self.bridge, subnet=str(self._subnet))
        return self

    def add_host(self, name: str) -> Host:
        """Creates a namespace with the next address, its veth on the bridge, loopback up and
        the empty chaos firewall, and returns it."""
        if name in self.hosts:
            raise NetnsError("host exists", host=name)
        index = len(self.hosts) + 2
        address = str(self._network[index])
        namespace = f"sk-{self.token}-{name}"
        outer, inner = f"ska{self.token}{index}", f"skc{self.token}{index}"
        _run(["ip", "netns", "add", namespace])
        host = Host(name, namespace, address, inner)
        self.hosts[name] = host
        _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
        self._devices.append(outer)
        _run(["ip", "link", "set", inner, "netns", namespace])
        _run(["ip", "link", "set", outer, "master", self.bridge, "up"])
        host.run(["ip", "addr", "add", f"{address}/24", "dev", inner])
        host.run(["ip", "link", "set", inner, "up"])
        host.run(["ip", "link", "set", "lo", "up"])
        host.run(["nft", "-f", "-"], stdin=_RULESET)
        return host

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise NetnsError("no such host", host=name) from None

    def partition(self, side_a: Iterable[Host], side_b: Iterable[Host]) -> None:
        """Cuts every host of `side_a` from every host of `side_b` (both directions)."""
        a, b = list(side_a), list(side_b)
        for host in a:
            host.block(h.address for h in b)
        for host in b:
            host.block(h.address for h in a)

    def heal(self) -> None:
        """Removes every fault of every host's network."""
        for host in self.hosts.values():
            host.heal()

    def close(self) -> None:
        """Kills every process on the hosts, deletes the namespaces, veths and bridge. Never
        raises: it runs after failures."""
        for host in self.hosts.values():
            try:
                host.kill_all()
            except Exception as e:
                log.warning("netns.kill_failed", host=host.name, error=str(e))
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True, check=False)
        for device in self._devices:
            if Path(f"/sys/class/net/{device}").exists():
                subprocess.run(["ip", "link", "del", device], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        log.info("netns.network_closed", bridge=self.bridge)

    def __enter__(self) -> Network:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
