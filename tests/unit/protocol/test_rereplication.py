"""Re-replication decisions: fragment bounds, the audit of lost bookies, copy plans."""

from __future__ import annotations

import itertools
import random

from stream.protocol.quorum import QuorumConfig
from stream.protocol.rereplication import (
    AuditFinding,
    FragmentView,
    audit_fragments,
    fragment_bounds,
    plan_copy_runs,
    replacement_ensemble,
)


def frag(first: int, *ensemble: str, last: int | None = None) -> FragmentView:
    return FragmentView(first, tuple(ensemble), last)


def test_a_fragment_followed_by_another_ends_right_before_it() -> None:
    fragments = [frag(0, "a", "b", "c"), frag(50, "a", "b", "d"), frag(90, "a", "e", "d")]
    bounds = [fragment_bounds(fragments, i, first_retained=0, sealed_last=None) for i in range(3)]
    assert bounds == [(0, 49), (50, 89), None]  # the open last fragment has no fixed end


def test_retention_rolls_and_seals_fix_the_bounds() -> None:
    rolled = [frag(0, "a", "b", "c", last=99), frag(100, "a", "b", "c")]
    assert fragment_bounds(rolled, 0, first_retained=30, sealed_last=None) == (30, 99)
    closed = [frag(0, "a", "b", "c", last=99)]
    assert fragment_bounds(closed, 0, first_retained=0, sealed_last=None) == (0, 99)
    sealed = [frag(0, "a", "b", "c"), frag(10, "a", "b", "d")]
    assert fragment_bounds(sealed, 1, first_retained=0, sealed_last=40) == (10, 40)
    # An empty fragment after the seal's no-op: nothing to copy.
    after = [frag(0, "a", "b", "c"), frag(41, "a", "b", "d")]
    first, last = fragment_bounds(after, 1, first_retained=0, sealed_last=40) or (0, 0)
    assert last < first


def test_the_audit_names_every_fragment_of_a_lost_bookie() -> None:
    fragments = [frag(0, "a", "b", "c"), frag(50, "a", "b", "d"), frag(90, "c", "e", "d")]
    findings = audit_fragments(fragments, {"c"}, first_retained=0, sealed_last=None)
    assert findings == [
        AuditFinding(0, 0, ("c",), fixed=True),
        AuditFinding(2, 90, ("c",), fixed=False),
    ]
    both = audit_fragments(fragments, {"d", "c"}, first_retained=0, sealed_last=None)
    assert [f.bookies for f in both] == [("c",), ("d",), ("c", "d")]
    assert audit_fragments(fragments, {"z"}, first_retained=0, sealed_last=None) == []


def test_replacement_keeps_every_index() -> None:
    assert replacement_ensemble(("a", "b", "c"), {"b": "x"}) == ("a", "x", "c")


def test_copy_runs_are_consecutive_ids_one_peer_holds() -> None:
    rng = random.Random(1)
    whole = QuorumConfig(3, 3, 2)  # every peer holds every id
    runs = plan_copy_runs(whole, ("b1", "b2", "b3"), "b1", [*range(0, 5000), 7000, 7001], rng)
    assert [(first, last) for _, first, last in runs] == [(0, 4095), (4096, 4999), (7000, 7001)]
    assert all(sorted(peers) == ["b2", "b3"] for peers, _, _ in runs)
    # E3 W2, b2 at index 1 holds e with e % 3 in (0, 1): entries 3 and 6 (with b1) and 4
    # (with b3); 3 and 4 are consecutive but no peer holds both, so they are two runs.
    striped = QuorumConfig(3, 2, 2)
    runs = plan_copy_runs(striped, ("b1", "b2", "b3"), "b2", [3, 4, 6], rng)
    assert runs == [(["b1"], 3, 3), (["b3"], 4, 4), (["b1"], 6, 6)]


def test_copy_plans_cover_the_share_from_live_peers_only() -> None:
    """For every small E/WQ and lost index, with one more bookie down: each run is
    consecutive ids of the lost index's share, its peers all hold the whole run... at least
    the first one does, and no peer is lost or down."""
    for e in range(1, 6):
        for wq in range(1, e + 1):
            config = QuorumConfig(e, wq, 1)
            ensemble = tuple(f"b{i}" for i in range(e))
            for lost, down in itertools.product(range(e), range(e)):
                share = list(config.bookie_index_entries(lost, 7, 60))
                unavailable = {ensemble[down]} if down != lost else set()
                runs = plan_copy_runs(
                    config,
                    ensemble,
                    ensemble[lost],
                    share,
                    random.Random(e * 31 + lost),
                    unavailable=unavailable,
                    max_run_entries=5,
                )
                covered = [i for _, first, last in runs for i in range(first, last + 1)]
                assert covered == share
                for peers, first, last in runs:
                    assert ensemble[lost] not in peers and not unavailable & set(peers)
                    assert last - first < 5
                    if peers:
                        for entry_id in range(first, last + 1):
                            assert peers[0] in config.write_set_bookies(ensemble, entry_id)
                    else:
                        # Only when the lost and the down bookie were the whole write set.
                        assert set(config.write_set_bookies(ensemble, first)) <= {
                            ensemble[lost],
                            *unavailable,
                        }


def test_share_runs_and_ends_agree_with_the_share() -> None:
    from stream.protocol.rereplication import share_ends, share_runs

    for e in range(1, 6):
        for wq in range(1, e + 1):
            config = QuorumConfig(e, wq, 1)
            for index in range(e):
                for first, last in ((0, 0), (3, 40), (7, 7), (5, 4)):
                    share = [i for i in range(first, last + 1) if config.stores_entry(index, i)]
                    runs = list(share_runs(config, index, first, last))
                    assert [i for a, b in runs for i in range(a, b + 1)] == share
                    assert all(b + 1 < c for (_, b), (c, _) in zip(runs, runs[1:], strict=False))
                    assert share_ends(config, index, first, last) == sorted(
                        {share[0], share[-1]} if share else set()
                    )
