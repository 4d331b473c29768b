"""The needless give-up (docs/design.md §10 progress): a writer that failed its ensemble change
with `NotEnoughBookiesError`, waiting on a pinned failed member, while another failed member
was not pinned and a spare could have taken its place the whole time. Replacing that one is
what lets LAFR advance and frees the pinned one (`stream.protocol.next_to_replace`); waiting
instead ends in an error the random faults alone did not force.

`PinWatch` samples each writer's pipeline (which members failed, which of them are pinned) at
every step of the run; `needless_give_up` judges one give-up from those samples and the run's
fault history (`stream.sim.fault_history`). Both only observe.

Sound by construction: with the protection on, the writer looks again at least every
`_WRITER_LOOK_S` while it waits on a pinned member, and stops waiting as soon as an unpinned
failed one exists. A give-up is judged needless only when every sample for `MIN_SPAN_S` (several
of the writer's looks) before it saw the waited-on member pinned and another failed and
unpinned, and a spare was up, writable, registered and reachable from the writer (and the
writer from the metadata) for all of that time.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from stream.client.pipeline import AddPipeline
from stream.sim.fault_history import FaultHistory
from stream.sim.network import ZK_NODE

# How often the writer looks again while it waits on a pinned member (`replace_bookie` waits
# for progress at most this long).
_WRITER_LOOK_S = 0.05
# How long the samples must have seen a replacement possible before the give-up: several
# looks, so that no look of a writer that has the protection can have missed it.
MIN_SPAN_S = 3 * _WRITER_LOOK_S
# The samples must reach the give-up this closely (the run's steps are at most 40 ms apart).
_MAX_GAP_S = 0.05


@dataclass
class Sampled:
    """What the samples of one writer's pipeline saw, each state since when it held in every
    sample (a state a sample missed starts again)."""

    ensemble: tuple[str, ...] = ()
    # Members replaced away by a change the metadata does not hold yet (no spare for now).
    unstored_away: frozenset[str] = frozenset()
    # Failed members of the ensemble, pinned / not pinned: since when, in every sample.
    pinned_since: dict[str, float] = field(default_factory=dict)
    unpinned_since: dict[str, float] = field(default_factory=dict)
    last_s: float = -1.0
    judged: bool = False


class PinWatch:
    """The samples of every writer's pipeline, by writer."""

    def __init__(self) -> None:
        self._writers: dict[object, Sampled] = {}

    def sample(self, writer: object, pipeline: AddPipeline | None, now: float) -> None:
        """Notes what `writer`'s `pipeline` looks like at `now`."""
        if pipeline is None or pipeline.closed:
            return
        seen = self._writers.setdefault(writer, Sampled())
        seen.ensemble = tuple(pipeline.ensemble)
        seen.unstored_away = frozenset(pipeline.unstored_away)
        seen.last_s = now
        failed = pipeline.failed & set(pipeline.ensemble)
        pinned = pipeline.pending.pinned_bookies() if failed else frozenset()
        for bookie_id in failed:
            mine, other = (
                (seen.pinned_since, seen.unpinned_since)
                if bookie_id in pinned
                else (seen.unpinned_since, seen.pinned_since)
            )
            mine.setdefault(bookie_id, now)
            other.pop(bookie_id, None)
        for since in (seen.pinned_since, seen.unpinned_since):
            for bookie_id in [b for b in since if b not in failed]:
                del since[bookie_id]

    def sampled(self, writer: object) -> Sampled | None:
        """Returns what the samples saw of `writer` (None: never sampled)."""
        return self._writers.get(writer)


@dataclass(frozen=True, slots=True)
class GiveUp:
    """One writer's failed ensemble change: who, when, and the member it was replacing."""

    writer: str
    term: int
    time_s: float
    waited_on: str


def needless_give_up(
    give_up: GiveUp,
    seen: Sampled,
    history: FaultHistory,
    spares: Collection[str],
) -> str | None:
    """Returns why `give_up` was needless (None: it was not, or the samples cannot tell):
    the member it waited on was pinned and another failed member was not, in every sample of
    at least `MIN_SPAN_S` before it, and one of `spares` (bookies outside the ensemble that
    could join it) was usable by the writer for all of that time (`history`)."""
    now, waited = give_up.time_s, give_up.waited_on
    if seen.judged or now - seen.last_s > _MAX_GAP_S or waited not in seen.pinned_since:
        return None
    for member, since in sorted(seen.unpinned_since.items(), key=lambda item: item[1]):
        if member == waited or now - since < MIN_SPAN_S or seen.pinned_since[waited] > since:
            continue
        if not history.link_clear(give_up.writer, ZK_NODE, since, now):
            return None  # its metadata could not place one
        if not history.client_clear(give_up.writer, since, now):
            return None
        usable = [
            s
            for s in sorted(spares)
            if s not in seen.ensemble
            and s not in seen.unstored_away
            and history.bookie_clear(s, since, now)
            and history.link_clear(give_up.writer, s, since, now)
        ]
        if usable:
            return (
                f"writer {give_up.writer} (term {give_up.term}) gave up replacing {waited} "
                f"(pinned) with NotEnoughBookiesError; {member} had failed unpinned since "
                f"t={since:.4f}s and spare {usable[0]} was usable all along: replacing "
                f"{member} first frees {waited}"
            )
    return None
