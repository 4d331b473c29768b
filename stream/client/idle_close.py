"""Take a stream without a live writer over and close its last fragment: what the retention
service does to an idle stream whose open fragment is past the age limit, and the auditor to
one whose open fragment names a lost or draining bookie.

The takeover (a new term; its recovery ends with the truncate no-op) fixes the stream's end;
the explicit LAC tells the bookies; then, when the caller wants it, the last fragment is closed
at the no-op and an empty one opened on the ensemble the caller chooses, as a capacity roll
does (`close_after_takeover`). The stream's writer registration is dropped at the end.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from stream.client.bookie_placement import truncate_members
from stream.client.explicit_lac import send_lac
from stream.client.options import WriterOptions
from stream.client.ports import BookieTransport, MetadataPort, WallClock
from stream.client.recovery import Takeover, TakeoverResult, WriterIdentity
from stream.client.takeover_signals import Fenced
from stream.errors import BadVersionError, StreamError
from stream.logs import get_logger
from stream.metadata.model import Fragment

log = get_logger(__name__)


class IdleClose(enum.Enum):
    """How a take-over-and-close ended."""

    # The last fragment was closed at the no-op and an empty one follows it.
    CLOSED = "closed"
    # The recovery left an empty last fragment (it moved on by itself): nothing to close.
    EMPTY = "empty"
    # The caller chose to keep the last fragment open (`next_ensemble` returned None).
    KEPT = "kept"
    # Another writer took over meanwhile, or a new member refused its truncation.
    YIELDED = "yielded"


# Given the takeover, the ensemble of the empty fragment to open (None: keep the last one).
NextEnsemble = Callable[[TakeoverResult], Awaitable[Sequence[str] | None]]
# Given the takeover, the timestamp of the closed fragment's newest real entry (None: unknown).
LastTimestamp = Callable[[TakeoverResult], Awaitable[int | None]]


@dataclass(frozen=True)
class IdleCloser:
    """Takes streams over as `identity` and closes their last fragments."""

    transport: BookieTransport
    metadata: MetadataPort
    clock: WallClock
    rng: random.Random
    options: WriterOptions
    identity: WriterIdentity
    bookie_timeout_s: float

    async def take_over_and_close(
        self,
        name: str,
        *,
        next_ensemble: NextEnsemble,
        last_timestamp: LastTimestamp | None = None,
    ) -> IdleClose:
        """Takes stream `name` over and, unless `next_ensemble` says to keep it, closes its
        last fragment at the no-op. Raises what the takeover raises (`StreamSealedError`,
        `InvalidTermError`, `StreamError`); its writer registration goes in every case."""
        result = await Takeover(
            name,
            transport=self.transport,
            metadata=self.metadata,
            clock=self.clock,
            rng=self.rng,
            options=self.options,
            identity=self.identity,
        ).run()
        try:
            return await self._close(result, next_ensemble, last_timestamp)
        finally:
            await self._unregister(result.meta.id)

    async def _close(
        self,
        result: TakeoverResult,
        next_ensemble: NextEnsemble,
        last_timestamp: LastTimestamp | None,
    ) -> IdleClose:
        current = result.last_fragment
        await send_lac(
            self.transport,
            result.meta.id,
            result.term,
            current.ensemble,
            result.last_entry_id,
            self.bookie_timeout_s,
        )
        ensemble = await next_ensemble(result)
        if ensemble is None:
            return IdleClose.KEPT
        if result.last_entry_id < current.first_entry_id:
            return IdleClose.EMPTY
        # The no-op is stamped now: a caller that ages the fragment by its newest real entry
        # says which timestamp that is.
        if last_timestamp is not None:
            newest_ts = await last_timestamp(result)
        else:
            newest_ts = result.last_timestamp_ms or current.last_timestamp_ms
        closed = Fragment(
            current.first_entry_id,
            current.ensemble,
            created_ms=current.created_ms,
            last_entry_id=result.last_entry_id,
            bytes=current.bytes,
            first_timestamp_ms=result.first_timestamp_ms or current.first_timestamp_ms,
            last_timestamp_ms=newest_ts,
        )
        fresh = Fragment(result.last_entry_id + 1, tuple(ensemble), created_ms=self.clock.now_ms())
        if await close_after_takeover(
            transport=self.transport,
            metadata=self.metadata,
            result=result,
            closed=closed,
            fresh=fresh,
            options=self.options,
        ):
            return IdleClose.CLOSED
        return IdleClose.YIELDED

    async def _unregister(self, stream_id: int) -> None:
        try:
            await self.metadata.unregister_writer(stream_id)
        except StreamError as e:
            log.debug("idle_close.unregister_failed", stream_id=stream_id, error=str(e))


async def close_after_takeover(
    *,
    transport: BookieTransport,
    metadata: MetadataPort,
    result: TakeoverResult,
    closed: Fragment,
    fresh: Fragment,
    options: WriterOptions,
) -> bool:
    """After a takeover that left its no-op in the last fragment: CASes `closed` (that
    fragment, with `last_entry_id` = the no-op) and opens `fresh` (empty, right after it), as
    a capacity roll does. Members of `fresh` that were not in `closed` get the new-member
    truncation first. Returns False when another writer took over meanwhile (the stream is
    its own then) or a member refused the truncation; rereads and retries a same-term CAS
    loss (retention, a worker's repair)."""
    newcomers = [b for b in fresh.ensemble if b not in closed.ensemble]
    try:
        refused = await truncate_members(
            transport,
            result.meta.id,
            result.term,
            newcomers,
            closed.last_entry_id if closed.last_entry_id is not None else fresh.first_entry_id - 1,
            options,
            enabled=options.protections.new_member_truncation,
        )
    except Fenced:
        return False
    if refused:
        return False
    version = result.version
    for _ in range(options.cas_attempts):
        try:
            await metadata.roll_fragment(result.meta.id, version, closed, fresh)
            return True
        except BadVersionError:
            meta, version, fragments = await metadata.get_snapshot(result.meta.id)
            if (
                meta.term != result.term
                or not fragments
                or fragments[-1].first_entry_id != closed.first_entry_id
            ):
                return False
    return False
