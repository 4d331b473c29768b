"""Codes and flags mirror the wire protocol; response classes follow BP-46."""

from __future__ import annotations

import pytest

from stream.protocol.codes import Code, EntryFlag, ResponseClass, classify, limbo_code
from stream.wire import bookie_pb2

EXPECTED_CLASS = {
    Code.CODE_UNSPECIFIED: ResponseClass.UNKNOWN,
    Code.OK: ResponseClass.POSITIVE,
    Code.NO_SUCH_ENTRY: ResponseClass.EXPLICIT_NEGATIVE,
    Code.NO_SUCH_STREAM: ResponseClass.EXPLICIT_NEGATIVE,
    Code.UNKNOWN: ResponseClass.UNKNOWN,
    Code.INVALID_TERM: ResponseClass.UNKNOWN,
    Code.TRIMMED: ResponseClass.UNKNOWN,
    Code.READ_ONLY: ResponseClass.UNKNOWN,
    Code.TOO_BUSY: ResponseClass.UNKNOWN,
    Code.BAD_REQUEST: ResponseClass.UNKNOWN,
    Code.INTERNAL: ResponseClass.UNKNOWN,
}


def test_code_matches_wire_enum_exactly() -> None:
    assert {c.name: c.value for c in Code} == dict(bookie_pb2.Code.items())


def test_entry_flag_matches_wire_enum_exactly() -> None:
    ours = {f.name: f.value for f in EntryFlag.__members__.values()}
    assert ours == dict(bookie_pb2.EntryFlag.items())


def test_every_code_has_an_expected_class() -> None:
    assert set(EXPECTED_CLASS) == set(Code)


@pytest.mark.parametrize("code", list(Code))
def test_classify_each_code(code: Code) -> None:
    assert classify(code) is EXPECTED_CLASS[code]
    # Generated protobuf code hands out plain ints.
    assert classify(int(code)) is EXPECTED_CLASS[code]


def test_transport_error_and_unrecognised_codes_are_unknown() -> None:
    assert classify(None) is ResponseClass.UNKNOWN
    assert classify(11) is ResponseClass.UNKNOWN
    assert classify(-1) is ResponseClass.UNKNOWN


@pytest.mark.parametrize("code", list(Code))
@pytest.mark.parametrize("limbo", [False, True])
def test_limbo_code_turns_only_explicit_negatives_into_unknown(code: Code, limbo: bool) -> None:
    result = limbo_code(code, limbo)
    if limbo and EXPECTED_CLASS[code] is ResponseClass.EXPLICIT_NEGATIVE:
        assert result is Code.UNKNOWN
    else:
        assert result == code
    if limbo:
        assert classify(result) is not ResponseClass.EXPLICIT_NEGATIVE


def test_entry_flags_combine() -> None:
    flags = EntryFlag.NOOP | EntryFlag.TRUNCATE
    assert int(flags) == 3
    assert EntryFlag.TRUNCATE in EntryFlag(3)
    assert EntryFlag.NOOP not in EntryFlag(EntryFlag.TRUNCATE)
