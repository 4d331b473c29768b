"""One `StreamClient` per process and metadata connect string: Spark reuses its Python
workers across tasks, so a task does not pay for a new ZooKeeper session and bookie channels."""

from __future__ import annotations

import os
import threading

from stream.client import StreamClient, TLSConfig

_lock = threading.Lock()
_clients: dict[tuple[int, str, TLSConfig | None, str | None], StreamClient] = {}


def client_for(
    metadata: str, tls: TLSConfig | None = None, metadata_auth_file: str | None = None
) -> StreamClient:
    """Returns this process's client of `metadata` (connected on first use; over TLS with
    `tls`, as `metadata_auth_file`'s ZooKeeper identity when given). Keyed by pid too: a
    client inherited through fork() has no loop thread and must not be used."""
    key = (os.getpid(), metadata, tls, metadata_auth_file)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = StreamClient.connect(metadata, tls=tls, metadata_auth_file=metadata_auth_file)
            _clients[key] = client
        return client
