"""Streams in ZooKeeper (docs/design.md §3): create/read/list/delete, and the term-atomic changes,
each one ZooKeeper multi-op that checks the `meta` znode's version.

Invariant that the consistent reads rely on: every change to a stream's fragment znodes (and
to anything else of the stream except its ephemeral `writer` and its consumers' `cursors`,
stream/metadata/cursors.py) rewrites `meta` in the same multi-op, so the meta version moves
with every change. A writer whose view is stale fails the CAS with `BadVersionError`, rereads,
sees the higher term and disengages."""

from __future__ import annotations

from stream.errors import BadVersionError, StreamSealedError
from stream.metadata.multiop import MAX_OPS_PER_MULTI, Op, first_error
from stream.metadata.stream_cas import OP_IDS_KEPT
from stream.metadata.stream_changes import StreamChanges
from stream.metadata.stream_creates import StreamCreates
from stream.metadata.stream_watches import StreamWatches, WatchHandle
from stream.metadata.stream_writers import WriterRegistration

__all__ = [
    "MAX_OPS_PER_MULTI",
    "OP_IDS_KEPT",
    "BadVersionError",
    "MetadataVersionError",
    "StreamSealedError",
    "StreamStore",
    "WatchHandle",
]

# The name design discussions use for the same condition.
MetadataVersionError = BadVersionError

# The names this module used before its jobs moved out.
_Op = Op
_first_error = first_error


class StreamStore(StreamCreates, StreamChanges, WriterRegistration, StreamWatches):
    """The streams under the session's metadata root: their `meta`, fragments and writer
    znodes, by job: reads (stream.metadata.stream_reads), creates and deletes
    (stream_creates), term-bound changes through one CAS (stream_changes, stream_cas), the
    writer znode (stream_writers) and watches (stream_watches). Thread-safe (kazoo clients
    are); every method may raise `MetadataError` when ZooKeeper does not answer within the
    session's retry deadline."""
