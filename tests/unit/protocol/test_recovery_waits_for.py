"""`recovery_waits_for`: what `streamctl info` says a stream IN_RECOVERY waits for."""

from __future__ import annotations

import itertools

from stream.protocol import QuorumConfig, recovery_waits_for

E3 = ("b1", "b2", "b3")


def test_every_case_of_a_three_bookie_ensemble() -> None:
    config = QuorumConfig(3, 3, 2)  # EC = 2
    for down_n, limbo_n in itertools.product(range(4), range(4)):
        down, limbo = set(E3[:down_n]), set(E3[3 - limbo_n :])
        for writer in (None, "w-1"):
            said = recovery_waits_for(config, E3, down, limbo, writer)
            if 3 - down_n < 2:
                assert said.startswith("bookies: a takeover needs 2 of the last fragment's 3")
                assert all(b in said for b in down)
            elif limbo:
                assert said.startswith("bookies in limbo (")
                assert "streamctl recover --accept-loss" in said
                assert all(b in said for b in limbo)
            elif writer is not None:
                assert said == "the takeover of writer w-1, running"
            else:
                assert said.startswith("a takeover that stopped midway")


def test_an_ack_quorum_of_one_needs_every_bookie_to_answer() -> None:
    said = recovery_waits_for(QuorumConfig(3, 2, 1), E3, {"b3"}, (), None)
    assert said == "bookies: a takeover needs 3 of the last fragment's 3 to answer; down: b3"
