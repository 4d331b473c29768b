"""The simulated bookie applies the real bookie's rules: the term rule, TRUNCATE, Truncate and
Trim, limbo, durability with and without the journal, BP-46 phase one, the LAC long poll."""

from __future__ import annotations

import asyncio

from stream.errors import StreamNotFoundError
from stream.framing.prepare import NOOP_TRUNCATE, prepare_entry
from stream.metadata.model import Fragment, StreamMeta, StreamState
from stream.protocol import Code
from stream.sim.bookie import BookieProtections, SimBookie
from stream.sim.loop import run_simulated
from stream.sim.trace import Trace
from stream.wire import bookie_pb2 as pb

S = 7


def _bookie(**kwargs: object) -> SimBookie:
    return SimBookie("b1", trace=Trace(lambda: 0.0), **kwargs)  # type: ignore[arg-type]


def _entry(entry_id: int, payload: bytes = b"x", flags: int = 0) -> pb.Entry:
    return prepare_entry(S, entry_id, flags, 1000, payload).entry()


def _add(
    bookie: SimBookie, term: int, *entries: pb.Entry, lac: int = -1, lafr: int = -1
) -> pb.AddResponse:
    request = pb.AddRequest(stream_id=S, term=term, lac=lac, lafr=lafr)
    request.entries.extend(entries)
    return bookie.add(request)


def _read(bookie: SimBookie, entry_id: int, term: int = 0) -> pb.ReadResponse:
    return bookie.read(pb.ReadRequest(stream_id=S, entry_id=entry_id, term=term))


def test_term_rule_on_adds_fences_and_recovery_reads() -> None:
    bookie = _bookie()
    assert list(_add(bookie, 2, _entry(0)).codes) == [Code.OK]
    rejected = _add(bookie, 1, _entry(1))
    assert list(rejected.codes) == [Code.INVALID_TERM] and rejected.bookie_term == 2
    assert bookie.fence(pb.FenceRequest(stream_id=S, term=3)).code == Code.OK
    assert _read(bookie, 0, term=2).code == Code.INVALID_TERM
    assert _read(bookie, 0).code == Code.OK  # a normal read carries no term
    assert _read(bookie, 0, term=4).code == Code.OK  # records term 4
    assert list(_add(bookie, 3, _entry(1)).codes) == [Code.INVALID_TERM]
    # A fence and a recovery read record the term even for a stream never seen (the TLA+
    # spec fences on recovery reads); the read then answers an explicit negative.
    assert bookie.fence(pb.FenceRequest(stream_id=S + 1, term=5)).bookie_term == 5
    read = bookie.read(pb.ReadRequest(stream_id=S + 2, entry_id=0, term=5))
    assert (read.code, read.bookie_term) == (Code.NO_SUCH_ENTRY, 5)
    assert bookie.streams[S + 2].term == 5
    stale = pb.AddRequest(stream_id=S + 2, term=4)
    stale.entries.append(prepare_entry(S + 2, 0, 0, 1000, b"x").entry())
    assert list(bookie.add(stale).codes) == [Code.INVALID_TERM]


def test_no_fence_serves_every_term() -> None:
    bookie = _bookie(protections=BookieProtections(enforce_terms=False))
    _add(bookie, 5, _entry(0, b"new"))
    assert list(_add(bookie, 1, _entry(0, b"old")).codes) == [Code.OK]
    assert _read(bookie, 0).entry.payload == b"old"
    assert bookie.streams[S].term == 5


def test_truncate_flag_and_requests_and_trim() -> None:
    bookie = _bookie()
    _add(bookie, 1, *(_entry(i) for i in range(6)))
    _add(bookie, 2, _entry(2, b"", NOOP_TRUNCATE))
    assert sorted(bookie.streams[S].entries) == [0, 1, 2]
    assert _read(bookie, 4).code == Code.NO_SUCH_ENTRY
    response = bookie.truncate(pb.TruncateRequest(stream_id=S, term=2, after_entry_id=0))
    assert response.code == Code.OK and sorted(bookie.streams[S].entries) == [0]
    stale = bookie.truncate(pb.TruncateRequest(stream_id=S, term=1, after_entry_id=-1))
    assert stale.code == Code.INVALID_TERM and sorted(bookie.streams[S].entries) == [0]
    _add(bookie, 2, *(_entry(i) for i in range(1, 4)))
    assert bookie.trim(pb.TrimRequest(stream_id=S, before_entry_id=2)).first_entry_id == 2
    assert _read(bookie, 1).code == Code.TRIMMED
    assert list(_add(bookie, 2, _entry(1)).codes) == [Code.TRIMMED]


def test_bad_checksum_is_refused() -> None:
    bookie = _bookie()
    entry = _entry(0)
    entry.payload = b"tampered"
    assert list(_add(bookie, 1, entry).codes) == [Code.BAD_REQUEST]


def test_read_range_stops_at_the_first_gap() -> None:
    bookie = _bookie()
    _add(bookie, 1, _entry(0), _entry(1), _entry(3))
    (response,) = bookie.read_range(
        pb.ReadRangeRequest(stream_id=S, first_entry_id=0, last_entry_id=3)
    )
    assert [e.entry_id for e in response.entries] == [0, 1]
    assert response.code == Code.NO_SUCH_ENTRY


def test_journal_less_crash_loses_unflushed_entries_but_not_terms_or_truncations() -> None:
    bookie = _bookie(journal_write_data=False)
    _add(bookie, 1, _entry(0), _entry(1, b"old"), lac=1, lafr=1)
    bookie.flush()
    _add(bookie, 1, _entry(2), _entry(3), lac=3, lafr=3)
    _add(bookie, 2, _entry(1, b"", NOOP_TRUNCATE))
    bookie.crash()
    bookie.start()
    state = bookie.streams[S]
    # The unflushed entries are lost; the truncating no-op was journaled like its truncation
    # (as in the real storage engine), so the flushed entry it replaced does not come back.
    assert sorted(state.entries) == [0, 1] and state.entries[1].flags == NOOP_TRUNCATE
    assert state.term == 2 and (state.lac, state.lafr) == (1, 1)


def test_journal_crash_keeps_entries_disk_loss_keeps_nothing() -> None:
    bookie = _bookie(journal_write_data=True)
    _add(bookie, 1, _entry(0), _entry(1), lac=0, lafr=0)
    bookie.crash()
    bookie.start()
    assert sorted(bookie.streams[S].entries) == [0, 1]
    assert bookie.streams[S].lafr == 0  # journaled with its batch
    bookie.crash(lose_disk=True)
    bookie.start()
    assert S not in bookie.streams


def _meta(term: int, state: StreamState = StreamState.OPEN) -> StreamMeta:
    return StreamMeta(
        name="s",
        id=S,
        ensemble=3,
        write_quorum=3,
        ack_quorum=2,
        fragment_max_entries=10,
        fragment_max_bytes=1 << 20,
        term=term,
        state=state,
    )


def _phase_one(protections: BookieProtections, *, lose_disk: bool) -> SimBookie:
    bookie = _bookie(journal_write_data=False, protections=protections)
    fragments = [Fragment(0, ("b1", "b2", "b3"), created_ms=1)]
    bookie.streams_with_bookie = lambda bookie_id: [(_meta(4), fragments)]
    _add(bookie, 1, _entry(0))
    bookie.crash(lose_disk=lose_disk)

    async def start() -> None:
        bookie.start()

    run_simulated(start())
    return bookie


def test_phase_one_raises_the_term_and_sets_limbo() -> None:
    bookie = _phase_one(BookieProtections(), lose_disk=True)
    state = bookie.streams[S]
    assert state.term == 4 and state.limbo
    assert _read(bookie, 0).code == Code.UNKNOWN  # not NO_SUCH_ENTRY: it may have had it
    assert list(_add(bookie, 3, _entry(0)).codes) == [Code.INVALID_TERM]


def test_phase_one_halves_can_be_switched_off() -> None:
    no_fence = _phase_one(BookieProtections(phase_one_fence=False), lose_disk=True)
    assert no_fence.streams[S].term == 0 and no_fence.streams[S].limbo
    no_limbo = _phase_one(BookieProtections(limbo=False), lose_disk=True)
    assert no_limbo.streams[S].term == 4 and not no_limbo.streams[S].limbo
    assert _read(no_limbo, 0).code == Code.NO_SUCH_ENTRY


def test_read_lac_long_poll_answers_when_the_lac_moves() -> None:
    bookie = _bookie()
    _add(bookie, 1, _entry(0), lac=-1)

    async def poll() -> tuple[int, float]:
        waiting = bookie.read_lac(pb.ReadLacRequest(stream_id=S, known_lac=-1, timeout_ms=500))
        assert isinstance(waiting, asyncio.Future)
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, lambda: _add(bookie, 1, _entry(1), lac=0))
        response = await waiting
        return response.lac, loop.time()

    lac, at = run_simulated(poll())
    assert lac == 0 and abs(at - 0.1) < 1e-6


def _wiped(protections: BookieProtections, meta: StreamMeta | None) -> SimBookie:
    """A bookie that held term 3 of stream S (named by no fragment: phase one skips it),
    then lost its disk; metadata now says `meta` (None: the stream was deleted)."""
    bookie = _bookie(protections=protections)
    bookie.metadata_reads = []  # type: ignore[attr-defined]

    def snapshot(stream_id: int) -> tuple[StreamMeta, int, list[Fragment]]:
        bookie.metadata_reads.append(stream_id)  # type: ignore[attr-defined]
        if meta is None:
            raise StreamNotFoundError("stream not found", stream_id=stream_id)
        return meta, 0, []

    bookie.streams_with_bookie = lambda bookie_id: []
    bookie.snapshot = snapshot
    bookie.next_stream_id = lambda: S + 1
    _add(bookie, 3, _entry(0))
    bookie.crash(lose_disk=True)

    async def start() -> None:
        bookie.start()

    run_simulated(start())
    return bookie


def test_a_wiped_bookie_learns_a_forgotten_term_from_metadata() -> None:
    sealed = _meta(3, StreamState.SEALED)
    for request in (
        lambda b: list(_add(b, 2, _entry(1)).codes)[0],
        lambda b: b.fence(pb.FenceRequest(stream_id=S, term=2)).code,
        lambda b: _read(b, 0, term=2).code,
        lambda b: b.truncate(pb.TruncateRequest(stream_id=S, term=2, after_entry_id=-1)).code,
    ):
        bookie = _wiped(BookieProtections(), sealed)
        assert request(bookie) == Code.INVALID_TERM
        assert bookie.streams[S].term == 3  # learned once, recorded
        unchecked = _wiped(BookieProtections(wiped_term_check=False), sealed)
        assert request(unchecked) in (Code.OK, Code.NO_SUCH_ENTRY)  # served: the old term
    bookie = _wiped(BookieProtections(), sealed)
    assert list(_add(bookie, 4, _entry(1)).codes) == [Code.OK]  # a newer term is served
    assert list(_add(bookie, 4, _entry(2)).codes) == [Code.OK]
    assert bookie.streams[S].term == 4
    # A stream created after the disk was replaced never had a term here: no metadata read.
    assert bookie.fence(pb.FenceRequest(stream_id=S + 1, term=1)).code == Code.OK
    assert bookie.metadata_reads == [S]  # type: ignore[attr-defined]


def test_a_wiped_bookie_refuses_a_deleted_stream() -> None:
    bookie = _wiped(BookieProtections(), None)
    assert list(_add(bookie, 2, _entry(1)).codes) == [Code.NO_SUCH_STREAM]
    assert bookie.fence(pb.FenceRequest(stream_id=S, term=9)).code == Code.NO_SUCH_STREAM
    assert S not in bookie.streams
