"""A range read's records, located (stream/bookie/storage/locations.py): the compiled
`index_runs` (_native.c) against its Python definition over random locations (runs in one log
and across logs, gaps, budgets below, inside and past the locations), a run that would wrap
past 2**64 in 64-bit arithmetic, and the locations both refuse."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from stream.bookie.storage.codec import LOCATION
from stream.bookie.storage.locations import index_runs_python
from stream.framing import native

pytestmark = pytest.mark.skipif(not native.BUILT, reason="the compiled module is not built")

HEADER = 12


def _random_locations(rng: random.Random) -> list[bytes]:
    """Consecutive entries' locations: mostly runs of adjacent records, some in another log,
    some after a gap (other streams' records), some moved (compaction: anywhere)."""
    located = []
    log = rng.choice([0, 1, 0xFFFFFFFF])
    offset = rng.choice([16, rng.getrandbits(40), (1 << 64) - rng.randrange(1 << 16)])
    for _ in range(rng.choice([0, 1, 2, 7, 300])):
        length = rng.choice([0, 1, 1040, rng.randrange(1 << 16), 0xFFFFFFFF])
        offset %= 1 << 64
        located.append(LOCATION.pack(log, offset, length))
        move = rng.random()
        if move < 0.05:
            log = rng.getrandbits(32)
        elif move < 0.1:
            offset += rng.randrange(1, 100)  # a gap
        elif move < 0.12:
            offset = rng.getrandbits(64)
            continue
        offset += length + HEADER
    return located


@pytest.mark.parametrize("seed", range(5))
def test_the_compiled_runs_are_the_python_definition(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        located = _random_locations(rng)
        total = sum(LOCATION.unpack(v)[2] for v in located)
        budget = rng.choice([-1, 0, 1, 1040, rng.randrange(total + 2), total, total + 1])
        expected = index_runs_python(located, budget, HEADER)
        assert native.index_runs(located, budget, HEADER) == expected
        count, runs = expected
        # Taken up to and with the location whose length brings the sum to the budget.
        lengths = [LOCATION.unpack(v)[2] for v in located]
        if located:
            assert 1 <= count <= len(located)
            assert count == 1 or sum(lengths[: count - 1]) < budget
            assert count == len(located) or sum(lengths[:count]) >= budget
        else:
            assert expected == (0, [])
        # The runs are the first `count` locations, in order, each of adjacent records.
        flat = [
            (log, offset, length)
            for log, base, offsets, lengths in runs
            for offset, length in zip(offsets, lengths, strict=True)
        ]
        assert flat == [LOCATION.unpack(v) for v in located[:count]]
        for _log, base, offsets, lengths in runs:
            assert offsets[0] == base
            assert all(
                offsets[k + 1] == offsets[k] + lengths[k] + HEADER for k in range(len(offsets) - 1)
            )


def test_a_run_does_not_wrap_past_the_end_of_64_bits() -> None:
    # The first record ends 10 bytes past 2**64: a next record at 22 (2**64 + 22 wrapped) is
    # not adjacent to it.
    located = [LOCATION.pack(1, (1 << 64) - 10, 20), LOCATION.pack(1, 22, 5)]
    expected = (2, [(1, (1 << 64) - 10, ((1 << 64) - 10,), (20,)), (1, 22, (22,), (5,))])
    assert index_runs_python(located, 100, HEADER) == expected
    assert native.index_runs(located, 100, HEADER) == expected


@pytest.mark.parametrize("runs", [index_runs_python, native.index_runs])
@pytest.mark.parametrize(
    "args",
    [
        ([LOCATION.pack(1, 16, 5), b"\x00" * 15], 100, HEADER),  # a location too short
        ([LOCATION.pack(1, 16, 5) + b"\x00"], 100, HEADER),  # too long
        ([LOCATION.pack(1, 16, 5)], 100, -1),  # a negative header
    ],
)
def test_what_is_not_a_location_is_refused(runs: Callable[..., Any], args: tuple[Any, ...]) -> None:
    with pytest.raises(ValueError):
        runs(*args)
