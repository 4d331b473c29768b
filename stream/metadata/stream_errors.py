"""The conflicts a stream's term-bound changes report (stream.metadata.streams re-exports
them)."""

from __future__ import annotations

from stream.errors import MetadataError


class BadVersionError(MetadataError):
    """The stream's `meta` znode is not at the expected version: another writer, a takeover or
    the retention service changed it. Reread the stream (its term may be higher) and decide."""


# The name design discussions use for the same condition.
MetadataVersionError = BadVersionError


class StreamSealedError(MetadataError):
    """The stream is SEALED: no takeover, no new fragment and no state change, ever again."""
