"""Free loopback ports for sandbox and test servers."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Ports handed out by this process: asking the kernel twice can give the same port back when
# nothing has bound the first one yet (a bookie's gRPC and metrics ports once collided so).
_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _candidates() -> range:
    # Below the kernel's ephemeral range, so an outgoing connection made between choosing the
    # port and binding it cannot take it.
    low, high = _ephemeral_range()
    return range(10000, low) if low > 12000 else range(high + 1, 65536)


def free_port(host: str = "127.0.0.1") -> int:
    """Returns a TCP port that was free on `host` a moment ago and that this process has not
    handed out before."""
    candidates = _candidates()
    for _ in range(1000):
        port = random.choice(candidates)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise OSError(f"no free port found on {host}")
