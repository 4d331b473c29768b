"""The way out of a stuck limbo (docs/design.md §4, `streamctl recover --accept-loss`): survey
what an accept-loss recovery would give up, and run it."""

from __future__ import annotations

import random
from dataclasses import dataclass

from stream.client.answers import answers_or_none
from stream.client.explicit_lac import take_over_publishing_lac
from stream.client.options import WriterOptions
from stream.client.ports import BookieTransport, MetadataPort, WallClock
from stream.client.recovery import Takeover, TakeoverResult, WriterIdentity
from stream.errors import InvalidArgumentError, StreamSealedError
from stream.logs import get_logger
from stream.metadata.model import StreamState
from stream.protocol import Code

log = get_logger(__name__)


@dataclass(frozen=True)
class BookieLimboState:
    """What one bookie of the last fragment said of the stream (`StreamState`, no term)."""

    bookie_id: str
    reachable: bool
    limbo: bool = False
    last_entry_id: int = -1  # highest entry id it holds (-1: none)
    lac: int = -1


@dataclass(frozen=True)
class LossSurvey:
    """What an accept-loss recovery of `stream` would give up, as seen before it runs: the
    previous term would end after `last_held_entry_id` (the last entry some reachable bookie of
    the last fragment holds), so the entries `first_at_risk` .. `last_at_risk` (a bound: what
    the previous writer could have acknowledged, assuming its window was this client's) may
    be lost; those up to `lac` were certainly acknowledged."""

    stream: str
    term: int
    state: str
    bookies: tuple[BookieLimboState, ...]
    last_held_entry_id: int
    lac: int
    first_at_risk: int
    last_at_risk: int

    @property
    def limbo_bookies(self) -> tuple[str, ...]:
        """Returns the reachable bookies of the last fragment that are in limbo."""
        return tuple(b.bookie_id for b in self.bookies if b.limbo)

    @property
    def unreachable_bookies(self) -> tuple[str, ...]:
        """Returns the bookies of the last fragment that did not answer."""
        return tuple(b.bookie_id for b in self.bookies if not b.reachable)


async def survey_loss(
    name: str, *, transport: BookieTransport, metadata: MetadataPort, options: WriterOptions
) -> LossSurvey:
    """Asks every bookie of the stream's last fragment what it holds and whether it is in limbo
    (term-less requests: nothing changes) and returns what an accept-loss recovery would give
    up. Raises `StreamSealedError` for a sealed stream."""
    meta, _ = await metadata.get_stream(name)
    if meta.state is StreamState.SEALED:
        raise StreamSealedError("stream is sealed", stream=name)
    _, _, fragments = await metadata.get_snapshot(meta.id)
    ensemble = fragments[-1].ensemble if fragments else ()
    answers = await answers_or_none(
        transport.stream_state(b, meta.id, timeout_s=options.fence_timeout_s) for b in ensemble
    )
    states: list[BookieLimboState] = []
    for bookie_id, answer in zip(ensemble, answers, strict=True):
        code = None if answer is None else int(answer.code)
        if answer is None or code not in (Code.OK, Code.NO_SUCH_STREAM):
            states.append(BookieLimboState(bookie_id, reachable=False))
        elif code == Code.NO_SUCH_STREAM:
            states.append(BookieLimboState(bookie_id, reachable=True))
        else:
            states.append(
                BookieLimboState(bookie_id, True, answer.limbo, answer.last_entry_id, answer.lac)
            )
    last_held = max((b.last_entry_id for b in states), default=-1)
    last_held = max(last_held, meta.first_entry_id - 1)
    lac = max((b.lac for b in states), default=-1)
    return LossSurvey(
        stream=name,
        term=meta.term,
        state=str(meta.state),
        bookies=tuple(states),
        last_held_entry_id=last_held,
        lac=lac,
        first_at_risk=last_held + 1,
        last_at_risk=max(last_held, lac) + options.window_entries,
    )


async def recover_accepting_loss(
    name: str,
    *,
    transport: BookieTransport,
    metadata: MetadataPort,
    clock: WallClock,
    rng: random.Random,
    options: WriterOptions,
    identity: WriterIdentity,
    operator: str,
) -> TakeoverResult:
    """The way out of a stuck limbo (docs/design.md §4, `streamctl recover --accept-loss`): runs a
    takeover whose recovery counts limbo UNKNOWNs as absent, so that it ends the previous term
    after the last entry some reachable bookie still holds; records what it gave up and who
    asked (`operator`) in the meta first; publishes the recovered LAC and leaves the stream
    OPEN with no writer. The bookies' repairs (phase two) then clear their limbo. The result's
    `accepted_loss` is None when no limbo stood in the way (nothing was given up)."""
    if not isinstance(operator, str) or not operator:
        raise InvalidArgumentError("operator must be a non-empty str", stream=name)
    result = await take_over_publishing_lac(
        Takeover(
            name,
            transport=transport,
            metadata=metadata,
            clock=clock,
            rng=rng,
            options=options,
            identity=identity,
            accept_loss_operator=operator,
        ),
        transport,
        options,
    )
    await metadata.unregister_writer(result.meta.id)
    log.info(
        "recovery.accept_loss_done",
        stream=name,
        term=result.term,
        last_entry_id=result.last_entry_id,
        gave_up=result.accepted_loss is not None,
        operator=operator,
    )
    return result
