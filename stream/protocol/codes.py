"""Response codes, entry flags and the three-way response classes of BP-46.

The numeric values mirror `proto/streamkeeper/v1/bookie.proto` (a unit test checks every name
and value) so that this package never imports the generated wire code.
"""

from __future__ import annotations

from enum import Enum, IntEnum, IntFlag


class Code(IntEnum):
    """A bookie's answer to one request; the values are the wire protocol's `Code`."""

    CODE_UNSPECIFIED = 0
    OK = 1
    NO_SUCH_ENTRY = 2
    NO_SUCH_STREAM = 3
    UNKNOWN = 4
    INVALID_TERM = 5
    TRIMMED = 6
    READ_ONLY = 7
    TOO_BUSY = 8
    BAD_REQUEST = 9
    INTERNAL = 10


class EntryFlag(IntFlag):
    """An entry's flag bits; the values are the wire protocol's `EntryFlag`."""

    FLAG_NONE = 0
    NOOP = 1
    TRUNCATE = 2
    ATTRIBUTES = 4


class ResponseClass(Enum):
    """What one answer proves: it holds, it does not hold, or nothing at all."""

    POSITIVE = "positive"
    EXPLICIT_NEGATIVE = "explicit_negative"
    UNKNOWN = "unknown"


# A transport error or timeout is passed as `None` wherever a code is expected: it proves nothing.
TRANSPORT_ERROR: None = None

_CLASS_BY_CODE: dict[int, ResponseClass] = {
    Code.OK: ResponseClass.POSITIVE,
    Code.NO_SUCH_ENTRY: ResponseClass.EXPLICIT_NEGATIVE,
    Code.NO_SUCH_STREAM: ResponseClass.EXPLICIT_NEGATIVE,
}


def classify(code: int | None) -> ResponseClass:
    """Return the response class of `code`; `None` (a transport error or timeout), unset
    and unrecognised values are UNKNOWN, because only an explicit negative may ever count
    toward deciding that something does not exist."""
    if code is None:
        return ResponseClass.UNKNOWN
    return _CLASS_BY_CODE.get(code, ResponseClass.UNKNOWN)


def limbo_code(code: Code, limbo: bool) -> Code:
    """Return the code a bookie sends for `code`: in limbo an explicit negative becomes
    UNKNOWN (the entry may have been written to us before a crash lost it); otherwise, and
    for every other code, `code` unchanged."""
    if limbo and _CLASS_BY_CODE.get(code) is ResponseClass.EXPLICIT_NEGATIVE:
        return Code.UNKNOWN
    return code
