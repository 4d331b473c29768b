"""`HOST:PORT` settings (listen and metrics addresses) as the processes parse them."""

from __future__ import annotations

from stream.errors import ConfigError


def split_host_port(key: str, address: str) -> tuple[str, int]:
    """Returns `(host, port)` of `address` ("HOST:PORT", IPv6 hosts in brackets); raises
    `ConfigError` naming the setting `key` otherwise."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"{key} must be HOST:PORT", key=key, value=address)
    return host.strip("[]"), int(port)
