"""Every error Streamkeeper raises sits under `StreamError` and carries its context."""

from __future__ import annotations

from typing import Any


class StreamError(Exception):
    """Base of all Streamkeeper errors; keyword context (stream, entry_id, bookie, term...)
    is kept in `context` and shown in the message."""

    def __init__(self, message: str, **context: Any) -> None:
        self.message = message
        self.context = {k: v for k, v in context.items() if v is not None}
        for key, value in self.context.items():
            setattr(self, key, value)
        super().__init__(message)

    def __str__(self) -> str:
        if not self.context:
            return self.message
        ctx = ", ".join(f"{k}={v!r}" for k, v in sorted(self.context.items()))
        return f"{self.message} ({ctx})"


class InvalidArgumentError(StreamError, ValueError):
    """A name, quorum, option or request that makes no sense; nothing was changed."""


class ConfigError(StreamError):
    """A configuration file or value is invalid; names the key."""


class StreamNotFoundError(StreamError):
    pass


class StreamExistsError(StreamError):
    pass


class BookieNotFoundError(InvalidArgumentError):
    """No bookie of that id ever joined the cluster (it has no cookie and no registration)."""


class InvalidTermError(StreamError):
    """Another writer took over: `term` is ours, `current_term` the newer one we saw."""

    def __init__(self, message: str, *, term: int, current_term: int, **context: Any) -> None:
        super().__init__(message, term=term, current_term=current_term, **context)


class StreamInUseError(StreamError):
    """A live writer holds the stream (its writer znode exists); the operation was refused and
    nothing changed. `force=True` (`--force` in streamctl) does it anyway."""


class EntryTrimmedError(StreamError):
    """The entry lies below the stream's first retained entry (`first_entry_id`)."""


class CursorNotFoundError(StreamError):
    """The stream has no cursor of that name (never committed, or deleted)."""


class CursorRegressionError(StreamError):
    """A commit below the cursor's committed position (`position`) was refused: another
    consumer (or a reset) moved it further. `commit(..., reset=True)` moves it back on purpose."""


class NotEnoughBookiesError(StreamError):
    pass


class BookieError(StreamError):
    """A bookie answered with a non-OK code (`code`, a name from the wire protocol)."""


class ChecksumError(StreamError):
    pass


class MetadataError(StreamError):
    """ZooKeeper metadata is missing, malformed, or a CAS kept failing."""


class MetadataUnavailableError(MetadataError):
    """ZooKeeper could not be reached, or did not answer, in time; trying later may work."""


class MetadataSessionExpiredError(MetadataError):
    """The ZooKeeper session expired while (or before) a call ran: its ephemeral znodes are gone
    and the outcome of a write in flight is unknown. Never retried silently: a writer must stop
    and re-check its term before it writes again."""


class BadVersionError(MetadataError):
    """The stream's `meta` znode is not at the expected version: another writer, a takeover or
    the retention service changed it. Reread the stream (its term may be higher) and decide."""


class StreamSealedError(MetadataError):
    """The stream is SEALED: no takeover, no new fragment and no state change, ever again."""


class CookieMismatchError(StreamError):
    """A bookie's directories and its registered cookie disagree; it must not serve."""


class StorageError(StreamError):
    """A bookie's local storage is corrupt or unusable."""


class EntryNotWrittenError(StreamError):
    """The entry is above the stream's last add confirmed (`lac`): not (yet) written."""


class StreamInLimboError(StreamError):
    """A takeover cannot fix where the previous term ended: bookies in limbo (BP-46: they
    crashed without the journal and may have lost acknowledged entries) answer UNKNOWN for the
    entry after the last one a bookie holds, and no recovery can prove it absent. `bookies`
    names them, `entry_id` the undecided entry. Limbo clears only after a recovery completes,
    so the stream stays stuck until an operator gives those entries up:
    `streamctl recover STREAM --accept-loss` (docs/design.md §4)."""


class AppendTimeoutError(StreamError, TimeoutError):
    """An append was not acknowledged within its `timeout_s`. Its fate is unknown: the entry
    may still be written (and read back) later; the writer goes on."""


class WriterClosedError(StreamError):
    """The writer was closed or aborted; appends are refused."""


class PermissionDeniedError(StreamError):
    """The caller's identity may not do this (ZooKeeper answered NoAuth: a read-only identity
    tried to write, or a wrong or missing metadata auth file); nothing was changed and trying
    again will not help."""
