"""The wire's response codes and entry flags under the short names the bookie uses, defined
once for the request handling (`stream.bookie.core`) and the storage engine, typed as the
wire's `Code` so that they go into response messages as they are."""

from __future__ import annotations

from typing import cast

from stream.wire import bookie_pb2 as pb

OK = pb.OK
NO_SUCH_ENTRY = pb.NO_SUCH_ENTRY
NO_SUCH_STREAM = pb.NO_SUCH_STREAM
INVALID_TERM = pb.INVALID_TERM
TRIMMED = pb.TRIMMED
READ_ONLY = pb.READ_ONLY
TOO_BUSY = pb.TOO_BUSY
BAD_REQUEST = pb.BAD_REQUEST
INTERNAL = pb.INTERNAL

FLAG_TRUNCATE = pb.TRUNCATE
FLAG_ATTRIBUTES = pb.ATTRIBUTES

_CODE_NAME = {value: name for name, value in pb.Code.items()}


def wire_code(code: int) -> pb.Code:
    """Returns `code` (a `stream.protocol.codes.Code` or another int holding a wire code) typed
    as the wire's `Code`. The two enums have the same values (tests/unit/protocol/test_codes.py
    checks every one), so this is a conversion of type only."""
    return cast(pb.Code, code)


def code_name(code: int) -> str:
    """Returns the wire name of `code` (its number when unknown), for metrics labels."""
    return _CODE_NAME.get(code, str(code))
