"""Prometheus metrics of the retention service: each durable cursor's lag, computed as the
service walks the streams (served on `streamctl retention run --metrics-listen HOST:PORT`)."""

from __future__ import annotations

from prometheus_client import Gauge, start_http_server

from stream.addresses import split_host_port
from stream.errors import ConfigError

CURSOR_LAG_ENTRIES = Gauge(
    "streamkeeper_cursor_lag_entries",
    "Entries between a durable cursor's committed position and the stream's LAC",
    ["stream", "cursor"],
)
CURSOR_LAG_BYTES = Gauge(
    "streamkeeper_cursor_lag_bytes",
    "Payload bytes between a durable cursor's position and the LAC (the open fragment's share "
    "estimated at the closed fragments' average entry size)",
    ["stream", "cursor"],
)
LAG_GAUGES = (CURSOR_LAG_ENTRIES, CURSOR_LAG_BYTES)


def serve_metrics(address: str) -> object:
    """Starts the Prometheus endpoint on `address` ("HOST:PORT") and returns its server
    (`shutdown()` stops it); raises `ConfigError` when it cannot listen there."""
    host, port = split_host_port("metrics_listen", address)
    try:
        server, _ = start_http_server(port, addr=host)
    except OSError as e:
        raise ConfigError(f"cannot serve metrics on {address}: {e}", key="metrics_listen") from e
    return server
