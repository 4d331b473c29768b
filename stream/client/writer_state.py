"""What the asyncio writer and its background jobs (ensemble change, roll) share: the ports, the
lifecycle, the term the last takeover installed with its pipeline and metadata version, the
open fragment, and the one way to commit a metadata change for a term."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

from stream.client.bookie_placement import BookiePlacement
from stream.client.open_fragment import OpenFragment
from stream.client.options import WriterOptions
from stream.client.pipeline import AddPipeline
from stream.client.ports import BookieTransport, MetadataPort, WallClock
from stream.client.producer import ProducerGate
from stream.errors import BadVersionError, InvalidTermError, MetadataError, StreamError
from stream.metadata.model import StreamMeta, StreamState
from stream.protocol.writer_lifecycle import Effect, Event, Lifecycle

# Feeds an event to the writer's lifecycle and carries out the effects; returns them.
StepFn = Callable[[Event], tuple[Effect, ...]]


class Superseded(Exception):
    """The pipeline (term) a metadata change was planned for was closed or replaced meanwhile:
    the change is dropped. Committing it with the next term's version would graft the old
    term's ensemble onto the new term (a replacement that never received the new term's
    entries, and that the old pipeline then fed its own; found by the BP-46 crash test)."""


class WriterState:
    """One writer's shared state. `pipeline`, `meta`, `version`, `term` and `fragment` are set
    by each takeover (`None`/-1/0 before the first); `error` once the writer stopped."""

    def __init__(
        self,
        name: str,
        *,
        transport: BookieTransport,
        metadata: MetadataPort,
        clock: WallClock,
        rng: random.Random,
        options: WriterOptions,
        reengage: bool,
    ) -> None:
        self.name = name
        self.transport = transport
        self.metadata = metadata
        self.clock = clock
        self.rng = rng
        self.options = options
        # Which jobs run (ensemble change, roll, re-engagement, trim check), closing, stopped:
        # the writer's `_step` feeds it events and carries out the effects it returns.
        self.life = Lifecycle(reengage=reengage)
        self.error: StreamError | None = None
        self.gate: ProducerGate | None = None  # set by the takeover of a producer writer
        self.pipeline: AddPipeline | None = None
        self.meta: StreamMeta | None = None
        self.version = -1
        self.term = 0
        self.fragment: OpenFragment | None = None

    def superseded(self, pipeline: AddPipeline) -> bool:
        """Returns whether `pipeline` is no longer the writer's live one (closed or replaced by
        a re-engaged term's)."""
        return pipeline is not self.pipeline or pipeline.closed

    def placement(self) -> BookiePlacement:
        """Returns how to place bookies for this writer (truncations carry its current term)."""
        return BookiePlacement(
            self.name,
            self.transport,
            self.metadata,
            self.rng,
            self.options,
            term=lambda: self.term,
        )

    async def commit(
        self, change: Callable[[int], Awaitable[tuple[StreamMeta, int]]], pipeline: AddPipeline
    ) -> None:
        """Runs one metadata CAS for `pipeline`'s term with the writer's version; after losing
        to a same-term change (retention), rereads and retries; a newer term raises
        `InvalidTermError`, and `Superseded` when the writer moved on to another pipeline
        (a re-engaged term) meanwhile."""
        assert self.meta is not None
        term = self.term
        for _ in range(self.options.cas_attempts):
            if self.superseded(pipeline) or self.term != term:
                raise Superseded()
            try:
                self.meta, self.version = await change(self.version)
                return
            except BadVersionError:
                meta, version, _ = await self.metadata.get_snapshot(self.meta.id)
                if self.superseded(pipeline) or self.term != term:
                    raise Superseded() from None
                if meta.term != term or meta.state is not StreamState.OPEN:
                    raise InvalidTermError(
                        "another writer took over the stream",
                        term=term,
                        current_term=meta.term,
                        stream=self.name,
                    ) from None
                self.meta, self.version = meta, version
        raise MetadataError("metadata change kept losing the CAS", stream=self.name)
