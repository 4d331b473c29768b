"""A takeover's metadata writes (docs/design.md §5 "Taking over"): step 1's CAS to a new term
in recovery, an accept-loss recovery's record of what it gives up, and step 6's CAS back to OPEN
with the fragments the recovery changed. Each rereads and retries a same-term CAS loss
(retention, a worker's repair) and stops at a newer term."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stream.client.options import WriterOptions
from stream.client.ports import MetadataPort, WallClock
from stream.errors import BadVersionError, InvalidTermError, MetadataError, StreamSealedError
from stream.logs import get_logger
from stream.metadata.model import (
    AcceptedLoss,
    Fragment,
    ProducerChange,
    StreamMeta,
    StreamState,
)
from stream.protocol import FragmentEnsemble

log = get_logger(__name__)


@dataclass(frozen=True)
class RecoveredFragments:
    """The fragments as a recovery left them: `changed` (the last one, with a replaced member)
    and `new` (started by local ensemble changes) for step 6; `current` is the last of all."""

    changed: list[Fragment]
    new: list[Fragment]
    current: Fragment


def recovered_fragments(
    last: Fragment, local: Sequence[FragmentEnsemble], now_ms: int
) -> RecoveredFragments:
    """Returns what the recovery's local ensemble changes (`local`: the write-backs' fragments,
    starting with `last`'s) make of the stream's fragments."""
    changed: list[Fragment] = []
    new: list[Fragment] = []
    current = last
    for first, ensemble in local:
        if first == last.first_entry_id:
            if tuple(ensemble) != tuple(last.ensemble):
                current = Fragment(first, tuple(ensemble), created_ms=last.created_ms)
                changed.append(current)
        else:
            current = Fragment(first, tuple(ensemble), created_ms=now_ms)
            new.append(current)
    return RecoveredFragments(changed, new, current)


class TakeoverMetadata:
    """The metadata writes of one takeover of stream `name`."""

    def __init__(
        self, name: str, *, metadata: MetadataPort, clock: WallClock, options: WriterOptions
    ) -> None:
        self.name = name
        self._metadata = metadata
        self._clock = clock
        self._options = options

    async def begin(self) -> tuple[StreamMeta, int, Fragment | None]:
        """Step 1: CASes the stream to the next term, IN_RECOVERY; returns the meta, its version
        and the last fragment (None: the stream has none). Raises `StreamSealedError`."""
        meta, version = await self._metadata.get_stream(self.name)
        for _ in range(self._options.cas_attempts):
            if meta.state is StreamState.SEALED:
                raise StreamSealedError("stream is sealed", stream=self.name)
            try:
                meta, version, last = await self._metadata.begin_takeover(meta.id, version)
                break
            except BadVersionError:
                meta, version = await self._metadata.get_stream(self.name)
        else:
            raise MetadataError("takeover kept losing the metadata CAS", stream=self.name)
        log.info(
            "recovery.term_started",
            stream=self.name,
            stream_id=meta.id,
            term=meta.term,
            last_fragment=None if last is None else last.first_entry_id,
        )
        return meta, version, last

    async def record_loss(
        self,
        meta: StreamMeta,
        version: int,
        end: int,
        frozen_lac: int,
        limbo: Sequence[str],
        operator: str,
    ) -> tuple[StreamMeta, int, AcceptedLoss]:
        """Records in the meta that this accept-loss recovery (asked by `operator`) ends the
        previous term before `end`, giving up `end` .. what the previous writer could have
        acknowledged (at most a window past the higher of the entry before `end` and the frozen
        LAC, assuming its window was ours); returns the meta, its version and the record."""
        loss = AcceptedLoss(
            term=meta.term,
            first_entry_id=end,
            last_entry_id=max(end - 1, frozen_lac) + self._options.window_entries,
            limbo_bookies=tuple(sorted(limbo)),
            operator=operator,
            at_ms=self._clock.now_ms(),
        )
        log.warning(
            "recovery.loss_accepted",
            stream=self.name,
            term=meta.term,
            first_entry_id=loss.first_entry_id,
            last_entry_id=loss.last_entry_id,
            frozen_lac=frozen_lac,
            limbo_bookies=list(loss.limbo_bookies),
            operator=operator,
        )
        for _ in range(self._options.cas_attempts):
            try:
                meta, version = await self._metadata.record_accepted_loss(meta.id, version, loss)
                return meta, version, loss
            except BadVersionError:
                meta, version, _ = await self._metadata.get_snapshot(meta.id)  # retention
        raise MetadataError("recording the accepted loss kept losing the CAS", stream=self.name)

    async def finish(
        self,
        meta: StreamMeta,
        version: int,
        changed: list[Fragment],
        new: list[Fragment],
        first_of_term: int,
        producers: ProducerChange | None = None,
    ) -> tuple[StreamMeta, int]:
        """Step 6: CASes the stream OPEN with the recovery's fragments (and what it records of
        producers); rereads and retries when a same-term change (retention) moved the version
        first."""
        term = meta.term
        for _ in range(self._options.cas_attempts):
            try:
                return await self._metadata.finish_recovery(
                    meta.id, version, term, changed, new, first_of_term, producers
                )
            except BadVersionError:
                meta, version, _ = await self._metadata.get_snapshot(meta.id)
                if meta.term != term:
                    raise InvalidTermError(
                        "another writer took over during recovery",
                        term=term,
                        current_term=meta.term,
                        stream=self.name,
                    ) from None
        raise MetadataError("finishing the recovery kept losing the CAS", stream=self.name)
