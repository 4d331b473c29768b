"""One `StreamClient` per process and metadata connect string: Spark reuses its Python
workers across tasks, so a task does not pay for a new ZooKeeper session and bookie channels."""

from __future__ import annotations

import os
import threading

from stream.client import StreamClient

_lock = threading.Lock()
_clients: dict[tuple[int, str, str | None], StreamClient] = {}


def client_for(metadata: str, metadata_auth_file: str | None = None) -> StreamClient:
    """Returns this process's client of `metadata` as `metadata_auth_file`'s identity
    (connected on first use). Keyed by pid too: a client inherited through fork() has no loop
    thread and must not be used."""
    key = (os.getpid(), metadata, metadata_auth_file)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = StreamClient.connect(metadata, metadata_auth_file=metadata_auth_file)
            _clients[key] = client
        return client
