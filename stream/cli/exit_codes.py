"""`streamctl`'s exit codes, and the one table that maps errors to them (docs/design.md §9): scripts
branch on the code, people read the message."""

from __future__ import annotations

import enum

from stream.errors import (
    BadVersionError,
    BookieNotFoundError,
    CursorNotFoundError,
    CursorRegressionError,
    EntryNotWrittenError,
    EntryTrimmedError,
    InvalidArgumentError,
    InvalidTermError,
    MetadataSessionExpiredError,
    MetadataUnavailableError,
    NotEnoughBookiesError,
    PermissionDeniedError,
    StreamExistsError,
    StreamInUseError,
    StreamNotFoundError,
    StreamSealedError,
)


class ExitCode(enum.IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2  # the command line makes no sense; nothing was changed
    NOT_FOUND = 3
    UNAVAILABLE = 4  # metadata or bookies did not answer in time: trying later may work
    CONFLICT = 5  # someone else got there first: superseded, exists, sealed, in use
    DENIED = 6  # the caller's identity may not do this; nothing was changed


# Looked up along the exception's MRO, so the most specific class listed wins
# (StreamSealedError is a MetadataError, but a conflict).
_CODES: dict[type[BaseException], ExitCode] = {
    InvalidArgumentError: ExitCode.USAGE,
    StreamNotFoundError: ExitCode.NOT_FOUND,
    BookieNotFoundError: ExitCode.NOT_FOUND,
    CursorNotFoundError: ExitCode.NOT_FOUND,
    EntryTrimmedError: ExitCode.NOT_FOUND,
    EntryNotWrittenError: ExitCode.NOT_FOUND,
    MetadataUnavailableError: ExitCode.UNAVAILABLE,
    MetadataSessionExpiredError: ExitCode.UNAVAILABLE,
    NotEnoughBookiesError: ExitCode.UNAVAILABLE,
    TimeoutError: ExitCode.UNAVAILABLE,  # also concurrent.futures.TimeoutError
    InvalidTermError: ExitCode.CONFLICT,
    StreamExistsError: ExitCode.CONFLICT,
    StreamInUseError: ExitCode.CONFLICT,
    StreamSealedError: ExitCode.CONFLICT,
    BadVersionError: ExitCode.CONFLICT,
    CursorRegressionError: ExitCode.CONFLICT,
    PermissionDeniedError: ExitCode.DENIED,
}


def exit_code_for(error: BaseException) -> ExitCode:
    """Returns the exit code that `error` ends `streamctl` with (ERROR when none is listed)."""
    for cls in type(error).__mro__:
        if cls in _CODES:
            return _CODES[cls]
    return ExitCode.ERROR
