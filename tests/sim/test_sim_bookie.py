"""The simulator's bookie is the shipping one on a simulated disk: the term rule and no-fence,
TRUNCATE and Trim, durability with and without the journal across crashes and a lost disk,
BP-46 phase one and the forgotten-terms check after a lost disk, the LAC long poll, and disk
faults (full, read-only)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from stream.errors import StreamNotFoundError
from stream.framing.prepare import NOOP_TRUNCATE, prepare_entry
from stream.metadata.model import Fragment, StreamMeta, StreamState
from stream.protocol import Code
from stream.sim.bookie import BookieProtections, SimBookie
from stream.sim.loop import run_simulated
from stream.sim.trace import Trace
from stream.wire import bookie_pb2 as pb

S = 7
T = TypeVar("T")


def _sim(body: Callable[[], Awaitable[T]]) -> T:
    return run_simulated(body())


def _bookie(**kwargs: Any) -> SimBookie:
    return SimBookie("b1", trace=Trace(asyncio.get_running_loop().time), **kwargs)


def _entry(entry_id: int, payload: bytes = b"x", flags: int = 0) -> pb.Entry:
    return prepare_entry(S, entry_id, flags, 1000, payload).entry()


async def _add(
    bookie: SimBookie, term: int, *entries: pb.Entry, lac: int = -1, lafr: int = -1
) -> list[int]:
    request = pb.AddRequest(stream_id=S, term=term, lac=lac, lafr=lafr)
    request.entries.extend(entries)
    return list((await bookie.add(request)).codes)


async def _read(bookie: SimBookie, entry_id: int, term: int = 0) -> pb.ReadResponse:
    return await bookie.read(pb.ReadRequest(stream_id=S, entry_id=entry_id, term=term))


def _ids(bookie: SimBookie, upto: int = 10) -> list[int]:
    return [i for i in range(upto) if bookie.held(S, i) is not None]


def test_term_rule_on_adds_fences_and_recovery_reads() -> None:
    async def body() -> None:
        bookie = _bookie()
        assert await _add(bookie, 2, _entry(0)) == [Code.OK]
        assert await _add(bookie, 1, _entry(1)) == [Code.INVALID_TERM]
        assert (await bookie.fence(pb.FenceRequest(stream_id=S, term=3))).code == Code.OK
        assert (await _read(bookie, 0, term=2)).code == Code.INVALID_TERM
        assert (await _read(bookie, 0)).code == Code.OK  # a normal read carries no term
        assert await _add(bookie, 3, _entry(1)) == [Code.OK]
        no_fence = SimBookie(
            "b2",
            trace=Trace(asyncio.get_running_loop().time),
            protections=BookieProtections(enforce_terms=False),
        )
        await _add(no_fence, 5, _entry(0, b"new"))
        assert await _add(no_fence, 1, _entry(0, b"old")) == [Code.OK]
        assert no_fence.held(S, 0).payload == b"old"  # type: ignore[union-attr]

    _sim(body)


def test_truncate_flag_requests_and_trim() -> None:
    async def body() -> None:
        bookie = _bookie()
        await _add(bookie, 1, *(_entry(i) for i in range(6)))
        await _add(bookie, 2, _entry(2, b"", NOOP_TRUNCATE))
        assert _ids(bookie) == [0, 1, 2]
        truncate = pb.TruncateRequest(stream_id=S, term=2, after_entry_id=0)
        assert (await bookie.truncate(truncate)).code == Code.OK and _ids(bookie) == [0]
        await _add(bookie, 2, *(_entry(i) for i in range(1, 4)))
        trimmed = await bookie.trim(pb.TrimRequest(stream_id=S, before_entry_id=2))
        assert trimmed.first_entry_id == 2
        assert (await _read(bookie, 1)).code == Code.TRIMMED
        (batch,) = bookie.read_range(
            pb.ReadRangeRequest(stream_id=S, first_entry_id=2, last_entry_id=5)
        )
        assert [e.entry_id for e in batch.entries] == [2, 3]
        assert batch.code == Code.NO_SUCH_ENTRY

    _sim(body)


def test_crashes_keep_what_was_synced() -> None:
    async def body() -> None:
        journal_less = _bookie(journal_write_data=False)
        await _add(journal_less, 1, _entry(0), _entry(1, b"old"), lac=0, lafr=0)
        journal_less.flush()
        await _add(journal_less, 1, _entry(2), _entry(3), lac=0, lafr=0)
        assert await _add(journal_less, 2, _entry(1, b"", NOOP_TRUNCATE)) == [Code.OK]
        journal_less.crash()
        journal_less.start()
        # Unflushed entries are lost; the truncating no-op was journaled with its truncation.
        assert _ids(journal_less) == [0, 1]
        assert journal_less.held(S, 1).flags == NOOP_TRUNCATE  # type: ignore[union-attr]
        assert journal_less.streams.get(S).term == 2  # type: ignore[union-attr]

        journaled = SimBookie("b2", trace=Trace(asyncio.get_running_loop().time))
        await _add(journaled, 1, _entry(0), _entry(1), lac=0, lafr=0)
        journaled.crash()
        journaled.start()
        assert _ids(journaled) == [0, 1]
        journaled.crash(lose_disk=True)
        journaled.start()
        assert journaled.streams.get(S) is None

    _sim(body)


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


async def _after_phase_one(protections: BookieProtections) -> SimBookie:
    bookie = _bookie(journal_write_data=False, protections=protections)
    fragments = [Fragment(0, ("b1", "b2", "b3"), created_ms=1)]
    bookie.streams_with_bookie = lambda bookie_id: [(_meta(4), fragments)]
    await _add(bookie, 1, _entry(0))
    bookie.crash()
    bookie.start()
    return bookie


def test_phase_one_raises_the_term_and_sets_limbo_and_each_half_switches_off() -> None:
    async def body() -> None:
        bookie = await _after_phase_one(BookieProtections())
        state = bookie.streams.get(S)
        assert state is not None and state.term == 4 and state.limbo
        assert (await _read(bookie, 0)).code == Code.UNKNOWN  # it may have had it
        assert await _add(bookie, 3, _entry(0)) == [Code.INVALID_TERM]
        no_fence = (await _after_phase_one(BookieProtections(phase_one_fence=False))).streams
        assert (no_fence.get(S).term, no_fence.get(S).limbo) == (1, True)  # type: ignore[union-attr]
        no_limbo = await _after_phase_one(BookieProtections(limbo=False))
        assert no_limbo.streams.get(S).term == 4  # type: ignore[union-attr]
        assert (await _read(no_limbo, 0)).code == Code.NO_SUCH_ENTRY
        switched = await _after_phase_one(BookieProtections(extra=frozenset({"limbo_unknown"})))
        assert switched.streams.get(S).limbo  # type: ignore[union-attr]
        assert (await _read(switched, 0)).code == Code.NO_SUCH_ENTRY  # the broken rule

    _sim(body)


def test_read_lac_long_poll_answers_when_the_lac_moves() -> None:
    async def body() -> tuple[int, float]:
        bookie = _bookie()
        await _add(bookie, 1, _entry(0), lac=-1)
        loop = asyncio.get_running_loop()
        start = loop.time()
        waiting = bookie.read_lac(pb.ReadLacRequest(stream_id=S, known_lac=-1, timeout_ms=500))
        loop.call_later(0.1, lambda: asyncio.ensure_future(_add(bookie, 1, _entry(1), lac=0)))
        response = await waiting
        return response.lac, loop.time() - start

    lac, after = _sim(body)
    assert lac == 0 and abs(after - 0.1) < 1e-3


async def _wiped(protections: BookieProtections, meta: StreamMeta | None) -> SimBookie:
    """A bookie that held term 3 of stream S (named by no fragment: phase one skips it),
    then lost its disk; metadata now says `meta` (None: the stream was deleted)."""
    bookie = _bookie(protections=protections)

    def snapshot(stream_id: int) -> tuple[StreamMeta, int, list[Fragment]]:
        if meta is None:
            raise StreamNotFoundError("stream not found", stream_id=stream_id)
        return meta, 0, []

    bookie.streams_with_bookie = lambda bookie_id: []
    bookie.snapshot = snapshot
    bookie.next_stream_id = lambda: S + 1
    await _add(bookie, 3, _entry(0))
    bookie.crash(lose_disk=True)
    bookie.start()
    return bookie


def test_a_wiped_bookie_learns_a_forgotten_term_or_refuses_a_deleted_stream() -> None:
    async def body() -> None:
        sealed = _meta(3, StreamState.SEALED)
        bookie = await _wiped(BookieProtections(), sealed)
        assert await _add(bookie, 2, _entry(1)) == [Code.INVALID_TERM]
        assert bookie.streams.get(S).term == 3  # type: ignore[union-attr]
        unchecked = await _wiped(BookieProtections(wiped_term_check=False), sealed)
        assert await _add(unchecked, 2, _entry(1)) == [Code.OK]  # served: the old term
        deleted = await _wiped(BookieProtections(), None)
        assert await _add(deleted, 2, _entry(1)) == [Code.NO_SUCH_STREAM]

    _sim(body)


def test_disk_faults_full_and_read_only() -> None:
    async def body() -> None:
        bookie = _bookie()
        assert await _add(bookie, 1, _entry(0)) == [Code.OK]
        bookie.set_disk_fault("read_only")
        assert await _add(bookie, 1, _entry(1)) == [Code.READ_ONLY]
        bookie.set_disk_fault(None)
        assert await _add(bookie, 1, _entry(1)) == [Code.OK]
        bookie.set_disk_fault("full")
        assert await _add(bookie, 1, _entry(2)) == [Code.READ_ONLY]
        recovery = pb.AddRequest(stream_id=S, term=1, lac=-1, lafr=-1, recovery=True)
        recovery.entries.append(_entry(2))
        # A recovery write-back is taken when read-only; the full disk fails its journal.
        assert list((await bookie.add(recovery)).codes) == [Code.INTERNAL]
        bookie.set_disk_fault(None)
        # As in production: a failed journal fails the storage until the bookie restarts.
        assert (await _read(bookie, 0)).code == Code.INTERNAL
        bookie.crash()
        bookie.start()  # a restart over the healed disk serves again
        assert await _add(bookie, 1, _entry(2)) == [Code.OK]

    _sim(body)
