"""How `streamctl` commands reach the cluster: the metadata connect string and connect timeout
come from the global options (`--metadata`, `--metadata-auth-file`, `--connect-timeout`), TLS
from `--tls-ca`, `--tls-cert` and `--tls-key`."""

from __future__ import annotations

import argparse
from typing import Any


def open_client(args: argparse.Namespace) -> Any:
    """Returns a `StreamClient` connected to `args.metadata` (imported here: commands that
    never connect must not pay for the client's imports)."""
    from stream.client import StreamClient

    return StreamClient.connect(
        args.metadata,
        timeout_s=args.connect_timeout,
        tls=tls_config(args),
        metadata_auth_file=args.metadata_auth_file,
    )


def tls_config(args: argparse.Namespace) -> Any:
    """Returns the `TLSConfig` of the TLS options, or None when `--tls-ca` is not given."""
    ca, cert, key = (getattr(args, name, None) for name in ("tls_ca", "tls_cert", "tls_key"))
    if ca is None:
        if cert is not None or key is not None:
            from stream.errors import InvalidArgumentError

            raise InvalidArgumentError("--tls-cert and --tls-key need --tls-ca")
        return None
    from stream.security.tls import TLSConfig

    return TLSConfig(ca, cert, key)


def open_session(args: argparse.Namespace, session_timeout_s: float = 10.0) -> Any:
    """Returns a `MetadataSession` connected to `args.metadata`."""
    from stream.metadata import MetadataSession

    return MetadataSession.connect(
        args.metadata,
        timeout_s=args.connect_timeout,
        session_timeout_s=session_timeout_s,
        auth_file=args.metadata_auth_file,
    )
