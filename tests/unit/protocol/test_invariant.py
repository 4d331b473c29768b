"""invariant() is always on, even under `python -O`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stream.errors import StreamError
from stream.protocol.invariant import InvariantViolation, invariant


def test_true_condition_passes() -> None:
    invariant(True, "never raised")
    invariant(1, "never raised", entry_id=3)


def test_false_condition_raises_with_context() -> None:
    with pytest.raises(InvariantViolation) as info:
        invariant(False, "LAC went backwards", lac=5, entry_id=3)
    assert info.value.context == {"lac": 5, "entry_id": 3}
    assert str(info.value) == "LAC went backwards (entry_id=3, lac=5)"


def test_violation_is_an_assertion_error_not_a_stream_error() -> None:
    assert issubclass(InvariantViolation, AssertionError)
    assert not issubclass(InvariantViolation, StreamError)


def test_still_raises_under_optimize_flag() -> None:
    code = (
        "from stream.protocol.invariant import invariant, InvariantViolation\n"
        "try:\n    invariant(0, 'x')\nexcept InvariantViolation:\n    raise SystemExit(7)\n"
    )
    result = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, timeout=60)
    assert result.returncode == 7, result.stderr
