"""One `StreamClient` per process and metadata connect string: Spark reuses its Python
workers across tasks, so a task does not pay for a new ZooKeeper session and bookie channels."""

from __future__ import annotations

import os
import threading

from stream.client import StreamClient, TLSConfig

_lock = threading.Lock()
_clients: dict[tuple[int, str, TLSConfig | None], StreamClient] = {}


def client_for(metadata: str, tls: TLSConfig | None = None) -> StreamClient:
    """Returns this process's client of `metadata` (connected on first use; over TLS with
    `tls`). Keyed by pid too: a client inherited through fork() has no loop thread and must
    not be used."""
    key = (os.getpid(), metadata, tls)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = StreamClient.connect(metadata, tls=tls)
            _clients[key] = client
        return client
