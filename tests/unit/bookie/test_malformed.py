"""Requests malformed as a whole (`stream.bookie.malformed`): each field at its bound passes,
one past it is refused with the RPC's message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stream.bookie.malformed import (
    malformed_add,
    malformed_fence,
    malformed_read,
    malformed_read_lac,
    malformed_read_range,
    malformed_stream_state,
    malformed_trim,
    malformed_truncate,
)
from stream.wire import bookie_pb2 as pb

# (check, a request at every bound, the fields of requests each one past a bound)
CASES: list[tuple[Callable[[Any], str | None], Any, list[dict[str, int]]]] = [
    (
        malformed_add,
        pb.AddRequest(stream_id=1, term=1, lac=-1, lafr=-1),
        [{"stream_id": 0}, {"term": 0}, {"lac": -2}, {"lafr": -2}],
    ),
    (malformed_fence, pb.FenceRequest(stream_id=1, term=1), [{"stream_id": 0}, {"term": 0}]),
    (malformed_read, pb.ReadRequest(stream_id=1, entry_id=0), [{"stream_id": 0}, {"entry_id": -1}]),
    (
        malformed_read_lac,
        pb.ReadLacRequest(stream_id=1, known_lac=-1),
        [{"stream_id": 0}, {"known_lac": -2}],
    ),
    (
        malformed_truncate,
        pb.TruncateRequest(stream_id=1, term=1, after_entry_id=-1),
        [{"stream_id": 0}, {"term": 0}, {"after_entry_id": -2}],
    ),
    (
        malformed_trim,
        pb.TrimRequest(stream_id=1, before_entry_id=0),
        [{"stream_id": 0}, {"before_entry_id": -1}],
    ),
    (malformed_stream_state, pb.StreamStateRequest(stream_id=1), [{"stream_id": 0}]),
    (
        malformed_read_range,
        pb.ReadRangeRequest(stream_id=1, first_entry_id=0, last_entry_id=0),
        [{"stream_id": 0}, {"first_entry_id": -1, "last_entry_id": -1}, {"first_entry_id": 1}],
    ),
]


@pytest.mark.parametrize(
    ("check", "valid", "invalid"), CASES, ids=[check.__name__ for check, _, _ in CASES]
)
def test_bounds(
    check: Callable[[Any], str | None], valid: Any, invalid: list[dict[str, int]]
) -> None:
    assert check(valid) is None
    for fields in invalid:
        request = type(valid)()
        request.CopyFrom(valid)
        for name, value in fields.items():
            setattr(request, name, value)
        reason = check(request)
        assert reason, f"{check.__name__} passed {fields}"
