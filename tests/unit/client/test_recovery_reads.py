"""`RecoveryReads` gathers recovery-read answers fast (bulk ReadRange, pipelined per-entry reads)
and still decides each entry by the DESIGN §5 step 3 rules: one positive recovers, QC explicit
negatives end, anything else is unknown; ReadRange's stops prove nothing."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from stream.client.entries import prepare_entry
from stream.client.options import WriterOptions
from stream.client.recovery_reads import BulkSource, EntryOutcome, RecoveryReads
from stream.protocol import Code, QuorumConfig, ReadOutcome
from stream.wire import bookie_pb2 as pb

STREAM_ID = 7
TERM = 3
ENSEMBLE = ("b1", "b2", "b3")


def entry(entry_id: int, payload: bytes | None = None) -> pb.Entry:
    prepared = prepare_entry(STREAM_ID, entry_id, 0, 1000 + entry_id, payload or b"e%d" % entry_id)
    return prepared.entry()


class FakeBookies:
    """A `BookieTransport` over dicts: `held[bookie][entry_id]`; bookies in `down` fail every
    request; `invalid_term` bookies answer INVALID_TERM to term-bearing reads. Counts the
    requests and the most per-entry reads of distinct entries in flight at once."""

    def __init__(self, held: dict[str, dict[int, pb.Entry]]) -> None:
        self.held = held
        self.down: set[str] = set()
        self.invalid_term: set[str] = set()
        self.unknown: set[str] = set()  # answer UNKNOWN (limbo-like) instead of negatives
        self.slow: set[str] = set()  # answer reads after a second
        self.range_requests: list[tuple[str, int, int]] = []
        self.reads: list[tuple[str, int]] = []
        self._in_flight: dict[int, int] = {}
        self.max_entries_in_flight = 0

    async def read(
        self, bookie_id: str, stream_id: int, entry_id: int, *, term: int = 0, timeout_s: float
    ) -> pb.ReadResponse:
        assert stream_id == STREAM_ID and term == TERM  # recovery reads carry the term
        self.reads.append((bookie_id, entry_id))
        self._in_flight[entry_id] = self._in_flight.get(entry_id, 0) + 1
        self.max_entries_in_flight = max(self.max_entries_in_flight, len(self._in_flight))
        try:
            await asyncio.sleep(1.0 if bookie_id in self.slow else 0.001)
            if bookie_id in self.down:
                raise ConnectionError("down")
            if bookie_id in self.invalid_term:
                return pb.ReadResponse(code=Code.INVALID_TERM, bookie_term=TERM + 1)
            found = self.held[bookie_id].get(entry_id)
            if found is None:
                code = Code.UNKNOWN if bookie_id in self.unknown else Code.NO_SUCH_ENTRY
                return pb.ReadResponse(code=code)
            response = pb.ReadResponse(code=Code.OK)
            response.entry.CopyFrom(found)
            return response
        finally:
            self._in_flight[entry_id] -= 1
            if not self._in_flight[entry_id]:
                del self._in_flight[entry_id]

    async def read_range(
        self,
        bookie_id: str,
        stream_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        max_batch_bytes: int = 0,
        timeout_s: float,
    ) -> AsyncIterator[pb.ReadRangeResponse]:
        self.range_requests.append((bookie_id, first_entry_id, last_entry_id))
        await asyncio.sleep(0.001)
        if bookie_id in self.down:
            raise ConnectionError("down")
        held = self.held[bookie_id]
        batch: list[pb.Entry] = []
        for entry_id in range(first_entry_id, last_entry_id + 1):
            if entry_id not in held:
                response = pb.ReadRangeResponse(code=Code.NO_SUCH_ENTRY)
                response.entries.extend(batch)
                yield response
                return
            batch.append(held[entry_id])
            if len(batch) == 10:  # several responses per range
                response = pb.ReadRangeResponse(code=Code.OK)
                response.entries.extend(batch)
                yield response
                batch = []
        response = pb.ReadRangeResponse(code=Code.OK)
        response.entries.extend(batch)
        yield response

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"recovery reads never call {name}")


def holding(ids: range, *bookies: str) -> dict[int, pb.Entry]:
    return {i: entry(i) for i in ids}


def scan(
    bookies: FakeBookies,
    start: int,
    *,
    config: QuorumConfig | None = None,
    sources: list[BulkSource] | None = None,
    **options: Any,
) -> tuple[list[EntryOutcome], RecoveryReads]:
    """Returns every outcome `RecoveryReads` yields from `start + 1` (checking the runs are
    consecutive and end at the first terminal outcome)."""
    config = config or QuorumConfig(3, 3, 2)
    if sources is None:
        sources = [BulkSource(b, max(held, default=-1)) for b, held in bookies.held.items()]
    reads = RecoveryReads(
        transport=bookies,  # type: ignore[arg-type]
        stream="s",
        stream_id=STREAM_ID,
        term=TERM,
        config=config,
        ensemble=ENSEMBLE,
        options=WriterOptions(**options),
        bulk_sources=sources,
    )

    async def collect() -> list[EntryOutcome]:
        got: list[EntryOutcome] = []
        async with contextlib.aclosing(reads.outcomes(start)) as runs:
            async for run in runs:
                assert run
                got.extend(run)
        return got

    got = asyncio.run(collect())
    assert [o.entry_id for o in got] == list(range(start + 1, start + 1 + len(got)))
    assert [o.terminal for o in got] == [False] * (len(got) - 1) + [True]
    return got, reads


def recovered(outcomes: list[EntryOutcome]) -> list[int]:
    return [o.entry_id for o in outcomes if o.outcome is ReadOutcome.RECOVERABLE]


def test_bulk_reads_the_window_in_chunks_and_per_entry_reads_find_the_end() -> None:
    bookies = FakeBookies({b: holding(range(0, 1000)) for b in ENSEMBLE})
    got, reads = scan(bookies, 99, recovery_range_entries=256)
    assert recovered(got) == list(range(100, 1000))
    assert got[-1].entry_id == 1000 and got[-1].outcome is ReadOutcome.ENDED
    assert all(o.entry == entry(o.entry_id) for o in got[:-1])
    assert reads.bulk_entries == 900
    # Chunks of 256 from one source, none past what it said it holds.
    assert all(last - first < 256 and last <= 999 for _, first, last in bookies.range_requests)
    # The end is decided by term-bearing reads to the write set (slow start: one entry).
    assert {e for _, e in bookies.reads} == {1000}


def test_a_hole_in_the_bulk_source_is_decided_per_entry_then_bulk_goes_on() -> None:
    held = {b: holding(range(0, 2000)) for b in ENSEMBLE}
    del held["b1"][500]  # the source with the most entries lacks one that others hold
    held["b1"][2000] = entry(2000)
    bookies = FakeBookies(held)
    got, reads = scan(bookies, -1, recovery_range_entries=400, recovery_read_ahead=16)
    assert recovered(got) == list(range(0, 2001))
    assert got[-1].entry_id == 2001 and got[-1].outcome is ReadOutcome.ENDED
    assert got[500].entry == entry(500)  # from b2 or b3, by a per-entry read
    assert reads.bulk_entries == 2001 - 16  # the stretch after the hole went per entry
    assert bookies.range_requests[0][0] == "b1"
    assert any(first == 516 for _, first, _ in bookies.range_requests)


def test_a_range_stop_proves_nothing_only_term_bearing_negatives_end() -> None:
    # Every source stops early (ReadRange answers NO_SUCH_ENTRY) but says it holds more; the
    # entries exist on the others, so per-entry reads recover them.
    held = {
        "b1": holding(range(0, 10)),
        "b2": {i: entry(i) for i in range(10, 20)},
        "b3": holding(range(0, 20)),
    }
    bookies = FakeBookies(held)
    sources = [BulkSource("b1", 19), BulkSource("b2", 19)]
    got, _ = scan(bookies, -1, sources=sources, recovery_read_ahead=4)
    assert recovered(got) == list(range(0, 20))
    assert got[-1].outcome is ReadOutcome.ENDED and got[-1].entry_id == 20


def test_a_failing_or_corrupt_source_falls_back_to_per_entry_reads() -> None:
    held = {b: holding(range(0, 300)) for b in ENSEMBLE}
    bad = entry(120)
    bad.crc32c ^= 1
    held["b1"][120] = bad
    bookies = FakeBookies(held)
    got, _ = scan(bookies, -1, sources=[BulkSource("b1", 299)])
    assert recovered(got) == list(range(0, 300))
    assert got[120].entry == entry(120)  # the corrupt copy proved nothing
    bookies = FakeBookies({b: holding(range(0, 300)) for b in ENSEMBLE})
    bookies.down.add("b1")
    got, reads = scan(bookies, -1, sources=[BulkSource("b1", 299)])
    assert recovered(got) == list(range(0, 300)) and reads.bulk_entries == 0


def test_unknown_answers_abort_and_a_newer_term_stops() -> None:
    # QC = 2: one explicit negative and two unknowns decide nothing.
    held = {b: holding(range(0, 50)) for b in ENSEMBLE}
    bookies = FakeBookies(held)
    bookies.unknown.update({"b2", "b3"})
    got, _ = scan(bookies, 9)
    assert got[-1].entry_id == 50 and got[-1].outcome is ReadOutcome.UNKNOWN
    bookies = FakeBookies({b: holding(range(0, 50)) for b in ENSEMBLE})
    bookies.invalid_term.add("b2")
    got, _ = scan(bookies, 9, sources=[])
    assert got[-1].newer_term == TERM + 1


def test_striped_ensembles_read_per_entry_within_the_window() -> None:
    config = QuorumConfig(3, 2, 2)
    held: dict[str, dict[int, pb.Entry]] = {b: {} for b in ENSEMBLE}
    for i in range(0, 600):
        for bookie in config.write_set_bookies(ENSEMBLE, i):
            held[bookie][i] = entry(i)
    bookies = FakeBookies(held)
    got, reads = scan(bookies, 99, config=config, recovery_read_ahead=32)
    assert recovered(got) == list(range(100, 600))
    assert got[-1].outcome is ReadOutcome.ENDED
    assert reads.bulk_entries == 0 and not bookies.range_requests
    assert 1 < bookies.max_entries_in_flight <= 32
    # Each entry's reads went to its write set only; a present entry cost one read (its
    # positive decides), and so did the end (WQ = AQ: QC is one explicit negative).
    assert all(b in config.write_set_bookies(ENSEMBLE, e) for b, e in bookies.reads)
    assert sum(e < 600 for _, e in bookies.reads) == 500
    assert [e for _, e in bookies.reads].count(600) == 1


def test_a_slow_first_member_is_hedged_by_the_rest_of_the_write_set() -> None:
    bookies = FakeBookies({b: holding(range(0, 40)) for b in ENSEMBLE})
    bookies.slow.add("b1")
    started = time.monotonic()
    got, _ = scan(bookies, -1, sources=[], recovery_read_hedge_s=0.01, recovery_read_ahead=64)
    assert recovered(got) == list(range(0, 40)) and got[-1].outcome is ReadOutcome.ENDED
    # Not one second per entry b1 leads (14 of them, ~one window): the others answered.
    assert time.monotonic() - started < 5.0
    led_by_b1 = [e for e in range(41) if config_write_set(e)[0] == "b1"]
    assert all(("b2", e) in bookies.reads or ("b3", e) in bookies.reads for e in led_by_b1)


def config_write_set(entry_id: int) -> tuple[str, ...]:
    return QuorumConfig(3, 3, 2).write_set_bookies(ENSEMBLE, entry_id)
