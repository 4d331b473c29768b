"""Step 2 of a takeover (docs/design.md §5 "Taking over"): fence the last fragment's ensemble
with the new term, and learn where recovery reads start and which bookies can serve them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from stream.client.answers import answer_or_none, cancel_all
from stream.client.options import WriterOptions
from stream.client.ports import BookieTransport
from stream.client.recovery_reads import BulkSource
from stream.client.takeover_signals import Fenced, RetryLater
from stream.errors import BookieError
from stream.metadata.model import Fragment, StreamMeta
from stream.protocol import Code, FenceOutcome, FenceTally


@dataclass(frozen=True)
class Fencing:
    """A fenced last fragment: recovery reads start after `start_entry_id`; `frozen_lac` is the
    LAC the write-backs carry; `sources` are the bookies that answered positively with the last
    entry each holds (for bulk recovery reads)."""

    start_entry_id: int
    frozen_lac: int
    sources: list[BulkSource]


@dataclass(frozen=True)
class _Answer:
    """One bookie's answer to the fence (or, with fencing off, to a StreamState request)."""

    code: int
    lac: int
    lafr: int
    last_entry_id: int
    bookie_term: int  # 0 when the request carries no term


async def fence_last_fragment(
    transport: BookieTransport, meta: StreamMeta, last: Fragment, options: WriterOptions
) -> Fencing:
    """Returns the fencing once EC of `last`'s ensemble took `meta.term`; raises `RetryLater`
    once AQ answered unknown, `Fenced` on INVALID_TERM."""
    tally = FenceTally(meta.quorum, last_fragment_first_entry_id=last.first_entry_id)
    timeout_s = options.fence_timeout_s
    fencing = options.protections.term_fencing

    async def ask(bookie_id: str) -> _Answer:
        if fencing:
            fenced = await transport.fence(bookie_id, meta.id, meta.term, timeout_s=timeout_s)
            return _Answer(
                fenced.code, fenced.lac, fenced.lafr, fenced.last_entry_id, fenced.bookie_term
            )
        state = await transport.stream_state(bookie_id, meta.id, timeout_s=timeout_s)
        return _Answer(state.code, state.lac, state.lafr, state.last_entry_id, 0)

    async def ask_indexed(index: int, bookie_id: str) -> tuple[int, _Answer | None]:
        return index, await answer_or_none(ask(bookie_id))

    tasks = [asyncio.ensure_future(ask_indexed(i, b)) for i, b in enumerate(last.ensemble)]
    bookie_term = 0
    sources: list[BulkSource] = []
    try:
        for next_done in asyncio.as_completed(tasks):
            index, answer = await next_done
            code: int | None = None
            lac = lafr = -1
            if answer is not None:
                code, lac, lafr = answer.code, answer.lac, answer.lafr
                if not fencing and code == Code.NO_SUCH_STREAM:
                    code = Code.OK  # without fencing, "nothing here" is a usable answer
                bookie_term = max(bookie_term, answer.bookie_term)
                if answer.code == Code.OK and answer.last_entry_id >= 0:
                    # It holds entries up to there: a source for bulk recovery reads.
                    sources.append(BulkSource(last.ensemble[index], answer.last_entry_id))
            outcome = tally.on_response(index, code, lac=lac, lafr=lafr)
            if tally.invalid_term_seen:
                raise Fenced(bookie_term)
            if outcome is not FenceOutcome.PENDING:
                break
    finally:
        await cancel_all(tasks)
    if tally.outcome is not FenceOutcome.COMPLETE:
        raise RetryLater(
            BookieError(
                "fencing failed: too many bookies of the last fragment did not answer",
                stream=meta.name,
                positives=tally.positives,
                unknowns=tally.unknowns,
            )
        )
    return Fencing(tally.start_entry_id, tally.frozen_lac, sources)
