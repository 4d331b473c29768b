"""The partitions that matter, on real processes, one after the other in one run: a writer cut
from ZooKeeper but not from the bookies (its session expires while the other writer takes
over: no acknowledgement after that takeover's recovery), a bookie cut from ZooKeeper while it
serves (auto-recovery runs in the bookies and must not copy over live data), and ZooKeeper
without a quorum (metadata writes stop, reads of committed entries go on). After each heal the
writers make progress."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream.sandbox.chaos.history import FAULT, HEAL, READ
from stream.sandbox.chaos.nemesis import Step
from stream.sandbox.chaos.run import run_chaos
from stream.sandbox.netns import unavailable_reason

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

_UNAVAILABLE = unavailable_reason()
if _UNAVAILABLE:
    pytest.skip(f"chaos tests need network namespaces: {_UNAVAILABLE}", allow_module_level=True)

# The workers' ZooKeeper sessions, shorter than a run's default (10 s) to keep the test short.
SESSION_TIMEOUT_S = 4.0
STEPS = [
    # Longer than the writer's session.
    Step(2.0, "writer-cut-from-zookeeper", "writer-2", SESSION_TIMEOUT_S + 3.0),
    # Longer than the bookie's 4 s session: its registration goes, it still serves.
    Step(2.0, "bookie-cut-from-zookeeper", "bookie-1", 7.0),
    Step(2.0, "zookeeper-no-quorum", "", 8.0),
]


def test_writer_and_bookie_cut_from_zookeeper_and_zookeeper_without_quorum(
    tmp_path: Path,
) -> None:
    result = run_chaos(
        tmp_path, seed=0, duration_s=0, steps=STEPS, progress_bound_s=10.0,
        session_timeout_s=SESSION_TIMEOUT_S,
    )  # fmt: skip
    verdict = result.verdict
    report = f"{verdict.summary()}\n" + "\n".join(str(v) for v in verdict.violations[:10])
    print(report)
    assert verdict.ok, report
    assert verdict.faults == {
        "writer-cut-from-zookeeper": 1,
        "bookie-cut-from-zookeeper": 1,
        "zookeeper-no-quorum": 1,
    }
    assert all(a.to_first_ack_after_heal_s is not None for a in verdict.availability), report
    # Committed entries are read while ZooKeeper has no quorum: the readers go on with the
    # fragments they know. Counted in the outage's second half: in the first, the server the
    # clients are on may not have noticed yet that it lost the quorum, and still answers.
    marks = [e for e in result.events if e["type"] in (FAULT, HEAL)]
    start, end = marks[-2]["t"], marks[-1]["t"]  # the ZooKeeper outage
    middle = (start + end) / 2
    reads = [e for e in result.events if e["type"] == READ and middle < e["t"] < end]
    print(f"entries read in the second half of the ZooKeeper outage: {len(reads)}")
    assert reads, report
