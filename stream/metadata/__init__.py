"""The ZooKeeper metadata layer (docs/design.md §3): sessions, the stream layout and its term-atomic
CAS operations, and the bookie registry. Pure data and kazoo calls, no bookie I/O."""

from stream.metadata.auth import (
    MetadataAuth,
    digest_id,
    load_metadata_auth,
    write_metadata_auth_file,
)
from stream.metadata.bookies import BookieRegistration, BookieRegistry
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
    CursorLag,
    CursorPosition,
    CursorStore,
    cursor_lag,
    validate_cursor_name,
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
    BadVersionError,
    MetadataVersionError,
    StreamSealedError,
    StreamStore,
    WatchHandle,
)

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
