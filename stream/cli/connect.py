"""How `streamctl` commands reach the cluster: the metadata connect string and connect timeout
come from the global options (`--metadata`, `--metadata-auth-file`, `--connect-timeout`)."""

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
        metadata_auth_file=args.metadata_auth_file,
    )


def open_session(args: argparse.Namespace, session_timeout_s: float = 10.0) -> Any:
    """Returns a `MetadataSession` connected to `args.metadata`."""
    from stream.metadata import MetadataSession

    return MetadataSession.connect(
        args.metadata,
        timeout_s=args.connect_timeout,
        session_timeout_s=session_timeout_s,
        auth_file=args.metadata_auth_file,
    )
