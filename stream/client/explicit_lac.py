"""Publishing an explicit LAC (an empty add) to an ensemble, so that readers see an end that no
writer will advertise with its next add: after a takeover that opens no writer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from stream.client.answers import answers_or_none
from stream.client.options import WriterOptions
from stream.client.ports import AddBatch, BookieTransport
from stream.client.recovery import Takeover, TakeoverResult


async def send_lac(
    transport: BookieTransport,
    stream_id: int,
    term: int,
    ensemble: Sequence[str],
    lac: int,
    timeout_s: float,
) -> None:
    """Sends an explicit LAC (an empty add) to every bookie of `ensemble`, best effort."""

    async def one(bookie_id: str) -> None:
        stream = transport.open_add_stream(bookie_id)
        try:
            await asyncio.wait_for(
                stream.send(AddBatch(stream_id=stream_id, term=term, lac=lac, lafr=lac)),
                timeout_s,
            )
        finally:
            stream.close()

    await answers_or_none(one(b) for b in ensemble)


async def take_over_publishing_lac(
    takeover: Takeover, transport: BookieTransport, options: WriterOptions
) -> TakeoverResult:
    """Runs `takeover` and publishes its recovered LAC to the last ensemble, for a takeover
    that opens no writer (a seal, an accept-loss recovery): readers see the end at once."""
    result = await takeover.run()
    await send_lac(
        transport,
        result.meta.id,
        result.term,
        result.last_fragment.ensemble,
        result.last_entry_id,
        options.add_timeout_s,
    )
    return result
