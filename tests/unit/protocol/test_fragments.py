"""Fragment lists: validation and lookup of the fragment holding an entry."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream.errors import InvalidArgumentError
from stream.protocol.fragments import (
    FragmentEnsemble,
    check_fragments,
    ensemble_for,
    fragment_index_for,
)

FRAGMENTS = [
    FragmentEnsemble(0, ("a", "b", "c")),
    FragmentEnsemble(12, ("d", "b", "c")),
    FragmentEnsemble(30, ("d", "e", "c")),
]


def test_lookup() -> None:
    assert ensemble_for(FRAGMENTS, 0) == ("a", "b", "c")
    assert ensemble_for(FRAGMENTS, 11) == ("a", "b", "c")
    assert ensemble_for(FRAGMENTS, 12) == ("d", "b", "c")
    assert ensemble_for(FRAGMENTS, 10**9) == ("d", "e", "c")
    # Plain tuples work as well as FragmentEnsemble.
    assert ensemble_for([(5, ["x"])], 7) == ("x",)
    with pytest.raises(InvalidArgumentError):
        fragment_index_for([(5, ("x",))], 4)


@pytest.mark.parametrize(
    "fragments",
    [
        [],
        [(-1, ("a", "b", "c"))],
        [(0, ("a", "b", "c")), (0, ("a", "b", "d"))],
        [(5, ("a", "b", "c")), (3, ("a", "b", "d"))],
        [(0, ("a", "b"))],
        [(0, ("a", "a", "b"))],
    ],
)
def test_malformed_fragment_lists_are_rejected(
    fragments: list[tuple[int, tuple[str, ...]]],
) -> None:
    with pytest.raises(InvalidArgumentError):
        check_fragments(fragments, 3)


def test_well_formed_list_passes() -> None:
    check_fragments(FRAGMENTS, 3)


@given(st.lists(st.integers(0, 200), min_size=1, unique=True), st.integers(0, 250))
def test_index_agrees_with_linear_scan(firsts: list[int], entry_id: int) -> None:
    fragments = [(first, ("x",)) for first in sorted(firsts)]
    candidates = [i for i, (first, _) in enumerate(fragments) if first <= entry_id]
    if not candidates:
        with pytest.raises(InvalidArgumentError):
            fragment_index_for(fragments, entry_id)
    else:
        assert fragment_index_for(fragments, entry_id) == candidates[-1]
