"""BP-46 on real processes: a wiped bookie never answers with a term it forgot (docs/design.md §4).

Journal-less bookies; a stream is written and SEALED (BP-46 phase one skips sealed streams), a
second stream lives on two of the three bookies (its fragments never name the third), a third
stream is deleted. Two bookies are wiped and come back with `auto_fix_cookie`. Then a raw `Add`
of the old (pre-seal) writer's term for the entry after the sealed end gets INVALID_TERM from
every bookie, the sealed stream's LAC does not move, the unnamed stream's old term is refused by
the wiped bookie its fragments never named, and the deleted stream is refused as deleted.

With the check switched off (the test-only `bookie start --unsafe-test-only-skip
wiped_term_check`), the same raw adds are acknowledged by the wiped bookies: the data loss of
issue 14, item 1a.
"""

from __future__ import annotations

import shutil

import pytest

from stream.client import StreamClient
from stream.sandbox.bookies import BookieProcess
from stream.wire import bookie_pb2 as pb
from tests.integration.bookie_support import add_all, add_request
from tests.integration.conftest import ClusterFactory

pytestmark = pytest.mark.integration

ENTRIES = 30
BOOKIES = ("bookie-1", "bookie-2", "bookie-3")


def wipe_and_restart(bookie: BookieProcess) -> None:
    """Stops the bookie, deletes its data directory and starts it again: its cookie check finds
    the directories empty and `auto_fix_cookie` repairs it (phase one, then serving)."""
    assert bookie.terminate() == 0
    shutil.rmtree(bookie.data_dir / "data")
    bookie.start()
    bookie.wait_ready(120)


def old_term_add(bookie: BookieProcess, stream_id: int, term: int, entry_id: int) -> pb.AddResponse:
    """Sends one add of `entry_id` with `term`, its LAC naming that entry (as a zombie writer
    that believes it acknowledged)."""
    request = add_request(stream_id, term, [entry_id], lac=entry_id, lafr=entry_id)
    (response,) = add_all(bookie.stub(), [request])
    return response


def bookie_lac(bookie: BookieProcess, stream_id: int) -> int:
    return bookie.stub().StreamState(pb.StreamStateRequest(stream_id=stream_id), timeout=10).lac


@pytest.mark.parametrize("check", ["on", "off"])
def test_wiped_bookies_refuse_superseded_writers_of_every_stream(
    cluster_factory: ClusterFactory, check: str
) -> None:
    cluster = cluster_factory(
        3, journal_write_data=False, flush_interval_ms=100, auto_fix_cookie=True
    )
    with StreamClient.connect(cluster.metadata) as client:
        client.create_stream("sealed", ensemble=3, write_quorum=3, ack_quorum=2)
        with client.open_writer("sealed") as writer:
            for i in range(ENTRIES):
                writer.append_async(f"sealed-{i}".encode())
            writer.flush()
            old_term = writer.term
        client.seal_stream("sealed")
        sealed = client.stream_info("sealed")
        assert sealed.term > old_term and sealed.lac >= ENTRIES - 1

        client.create_stream("unnamed", ensemble=2, write_quorum=2, ack_quorum=2)
        with client.open_writer("unnamed") as writer:
            writer.append(b"unnamed-0")
            unnamed_old_term = writer.term
        with client.open_writer("unnamed") as writer:  # a newer term, fenced on its bookies
            writer.append(b"unnamed-1")
        unnamed = client.stream_info("unnamed")
        (outside,) = set(BOOKIES) - set(unnamed.fragments[-1].ensemble)

        client.create_stream("gone", ensemble=3, write_quorum=3, ack_quorum=2)
        with client.open_writer("gone") as writer:
            writer.append(b"gone-0")
            gone_term = writer.term
        gone_id = client.stream_info("gone").stream_id
        client.delete_stream("gone")

        wiped = [outside, next(b for b in BOOKIES if b != outside)]
        for bookie_id in wiped:
            if check == "off":  # from its restart on
                cluster.bookie(bookie_id).unsafe_skips = ("wiped_term_check",)
            wipe_and_restart(cluster.bookie(bookie_id))

        after_end = sealed.lac + 1
        answers = {
            b: old_term_add(cluster.bookie(b), sealed.stream_id, old_term, after_end)
            for b in BOOKIES
        }
        outside_answer = old_term_add(
            cluster.bookie(outside), unnamed.stream_id, unnamed_old_term, unnamed.lac + 1
        )
        gone_answer = old_term_add(cluster.bookie(wiped[1]), gone_id, gone_term, 1)

        if check == "off":
            # The counterexample: the wiped bookies forgot the sealed stream's term.
            for bookie_id in wiped:
                assert list(answers[bookie_id].codes) == [pb.OK], answers[bookie_id]
                assert bookie_lac(cluster.bookie(bookie_id), sealed.stream_id) == after_end
            assert client.stream_info("sealed").lac == after_end
            assert list(outside_answer.codes) == [pb.OK]
            return

        for bookie_id, response in answers.items():
            assert list(response.codes) == [pb.INVALID_TERM], (bookie_id, response)
            assert response.bookie_term == sealed.term
            assert bookie_lac(cluster.bookie(bookie_id), sealed.stream_id) <= sealed.lac
        after = client.stream_info("sealed")
        assert (after.lac, after.term) == (sealed.lac, sealed.term)
        assert list(outside_answer.codes) == [pb.INVALID_TERM], outside_answer
        assert outside_answer.bookie_term >= unnamed.term
        assert list(gone_answer.codes) == [pb.NO_SUCH_STREAM], gone_answer
        assert "deleted" in gone_answer.message
        reader = client.open_reader("sealed")
        assert [e.payload for e in reader.read(0, ENTRIES - 1)] == [
            f"sealed-{i}".encode() for i in range(ENTRIES)
        ]
