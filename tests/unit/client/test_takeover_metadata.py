"""What a recovery's local ensemble changes make of the stream's fragments for step 6: the last
fragment changed in place when a member was replaced inside it, new fragments after it, and the
last of all as the one the writer continues on."""

from __future__ import annotations

from stream.client.takeover_metadata import recovered_fragments
from stream.metadata.model import Fragment
from stream.protocol import FragmentEnsemble

LAST = Fragment(100, ("a", "b", "c"), created_ms=5)


def test_no_local_change_changes_nothing() -> None:
    result = recovered_fragments(LAST, [FragmentEnsemble(100, ("a", "b", "c"))], now_ms=9)
    assert (result.changed, result.new, result.current) == ([], [], LAST)


def test_a_replacement_inside_the_last_fragment_changes_it_in_place() -> None:
    result = recovered_fragments(LAST, [FragmentEnsemble(100, ("a", "d", "c"))], now_ms=9)
    changed = Fragment(100, ("a", "d", "c"), created_ms=5)  # keeps its creation time
    assert (result.changed, result.new, result.current) == ([changed], [], changed)


def test_replacements_after_entries_start_new_fragments() -> None:
    local = [
        FragmentEnsemble(100, ("a", "b", "c")),
        FragmentEnsemble(120, ("a", "d", "c")),
        FragmentEnsemble(125, ("e", "d", "c")),
    ]
    result = recovered_fragments(LAST, local, now_ms=9)
    new = [
        Fragment(120, ("a", "d", "c"), created_ms=9),
        Fragment(125, ("e", "d", "c"), created_ms=9),
    ]
    assert (result.changed, result.new, result.current) == ([], new, new[-1])
