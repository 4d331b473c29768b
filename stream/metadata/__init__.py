"""The ZooKeeper metadata layer (docs/design.md §3): sessions, the stream layout and its term-atomic
CAS operations, and the bookie registry. Pure data and kazoo calls, no bookie I/O.

The names below load their module on first use (PEP 562): importing one kazoo-free module,
`stream.metadata.model` say, does not import kazoo."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stream.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from stream.errors import (
        BadVersionError,
        StreamSealedError,
    )
    from stream.metadata.auth import (
        MetadataAuth,
        digest_id,
        load_metadata_auth,
        write_metadata_auth_file,
    )
    from stream.metadata.bookies import (
        BookieRegistration,
        BookieRegistry,
    )
    from stream.metadata.connection import (
        DEFAULT_ROOT,
        MetadataSession,
        MetadataSessionExpiredError,
        SessionState,
        connect,
        parse_connect_string,
    )
    from stream.metadata.cursors import (
        MAX_CURSORS_PER_STREAM,
        CursorPosition,
        CursorStore,
        validate_cursor_name,
    )
    from stream.metadata.lag import (
        CursorLag,
        cursor_lag,
    )
    from stream.metadata.model import (
        AcceptedLoss,
        Fragment,
        ProducerChange,
        ProducerTerm,
        RetentionPolicy,
        StreamMeta,
        StreamState,
        WriterInfo,
        validate_bookie_id,
        validate_stream_name,
    )
    from stream.metadata.streams import (
        MAX_OPS_PER_MULTI,
        MetadataVersionError,
        StreamStore,
        WatchHandle,
    )

# name -> the module that defines it
_MODULES = {
    "DEFAULT_ROOT": "stream.metadata.connection",
    "MAX_CURSORS_PER_STREAM": "stream.metadata.cursors",
    "MAX_OPS_PER_MULTI": "stream.metadata.streams",
    "AcceptedLoss": "stream.metadata.model",
    "BadVersionError": "stream.errors",
    "BookieRegistration": "stream.metadata.bookies",
    "BookieRegistry": "stream.metadata.bookies",
    "CursorLag": "stream.metadata.lag",
    "CursorPosition": "stream.metadata.cursors",
    "CursorStore": "stream.metadata.cursors",
    "Fragment": "stream.metadata.model",
    "MetadataAuth": "stream.metadata.auth",
    "MetadataSession": "stream.metadata.connection",
    "MetadataSessionExpiredError": "stream.metadata.connection",
    "MetadataVersionError": "stream.metadata.streams",
    "ProducerChange": "stream.metadata.model",
    "ProducerTerm": "stream.metadata.model",
    "RetentionPolicy": "stream.metadata.model",
    "SessionState": "stream.metadata.connection",
    "StreamMeta": "stream.metadata.model",
    "StreamSealedError": "stream.errors",
    "StreamState": "stream.metadata.model",
    "StreamStore": "stream.metadata.streams",
    "WatchHandle": "stream.metadata.streams",
    "WriterInfo": "stream.metadata.model",
    "connect": "stream.metadata.connection",
    "cursor_lag": "stream.metadata.lag",
    "digest_id": "stream.metadata.auth",
    "load_metadata_auth": "stream.metadata.auth",
    "parse_connect_string": "stream.metadata.connection",
    "validate_bookie_id": "stream.metadata.model",
    "validate_cursor_name": "stream.metadata.cursors",
    "validate_stream_name": "stream.metadata.model",
    "write_metadata_auth_file": "stream.metadata.auth",
}

__all__ = [
    "DEFAULT_ROOT",
    "MAX_CURSORS_PER_STREAM",
    "MAX_OPS_PER_MULTI",
    "AcceptedLoss",
    "BadVersionError",
    "BookieRegistration",
    "BookieRegistry",
    "CursorLag",
    "CursorPosition",
    "CursorStore",
    "Fragment",
    "MetadataAuth",
    "MetadataSession",
    "MetadataSessionExpiredError",
    "MetadataVersionError",
    "ProducerChange",
    "ProducerTerm",
    "RetentionPolicy",
    "SessionState",
    "StreamMeta",
    "StreamSealedError",
    "StreamState",
    "StreamStore",
    "WatchHandle",
    "WriterInfo",
    "connect",
    "cursor_lag",
    "digest_id",
    "load_metadata_auth",
    "parse_connect_string",
    "validate_bookie_id",
    "validate_cursor_name",
    "validate_stream_name",
    "write_metadata_auth_file",
]


__getattr__ = lazy_exports(__name__, _MODULES)
