"""Reading one entry's timestamp from its bookies: what a takeover needs to carry the stream's
time forward (entry timestamps never go backwards within a stream) and to record its fragment's
first timestamp, and what retention ages an idle fragment by."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from stream.client.ports import BookieTransport, WallClock
from stream.framing.verify import checksum_ok
from stream.logs import get_logger
from stream.protocol import Code, QuorumConfig

log = get_logger(__name__)

_OK = int(Code.OK)  # an int: the answers carry the wire's own Code type


def stamp(clock: WallClock, floor_ms: int | None) -> int:
    """Returns the timestamp for the next entry: the clock, or `floor_ms` (the stream's last
    timestamp) when the clock is behind it. A writer whose clock lags keeps stamping the
    previous maximum, so the stream's time stands still until that clock catches up."""
    now_ms = clock.now_ms()
    return now_ms if floor_ms is None or now_ms >= floor_ms else floor_ms


async def read_timestamp(
    transport: BookieTransport, stream_id: int, bookie_id: str, entry_id: int, timeout_s: float
) -> int | None:
    """Returns the timestamp of entry `entry_id` as `bookie_id` holds it (no-ops included),
    None when it does not answer with that entry, verified."""
    if entry_id < 0:
        return None
    try:
        response = await asyncio.wait_for(
            transport.read(bookie_id, stream_id, entry_id, timeout_s=timeout_s), timeout_s
        )
    except Exception as e:  # an unknown answer
        log.debug("timestamps.read_failed", bookie=bookie_id, entry_id=entry_id, error=repr(e))
        return None
    entry = response.entry
    if response.code != _OK or entry.entry_id != entry_id:
        return None
    if not checksum_ok(stream_id, entry):
        log.warning("timestamps.bad_checksum", bookie=bookie_id, entry_id=entry_id)
        return None
    return int(entry.timestamp_ms)


async def timestamp_in_write_set(
    transport: BookieTransport,
    stream_id: int,
    quorum: QuorumConfig,
    ensemble: Sequence[str],
    entry_id: int,
    timeout_s: float,
) -> int | None:
    """Returns the timestamp of `entry_id` (of a fragment on `ensemble`) from the first bookie
    of its write set that has it, None when none does."""
    if entry_id < 0:
        return None
    for bookie_id in quorum.write_set_bookies(ensemble, entry_id):
        found = await read_timestamp(transport, stream_id, bookie_id, entry_id, timeout_s)
        if found is not None:
            return found
    return None
