"""Placing bookies for a stream: a fresh ensemble for a new fragment, and the one loop that
replaces a failed bookie of a pipeline's ensemble (the writer's ensemble change and a
takeover's local one both run `replace_bookie`). Joining bookies take the new-member
truncation first (docs/design.md §5 "Ensemble changes")."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from stream.client.answers import answers_or_none
from stream.client.options import WriterOptions
from stream.client.pipeline import AddPipeline
from stream.client.ports import BookieTransport, MetadataPort
from stream.client.takeover_signals import Fenced
from stream.errors import NotEnoughBookiesError
from stream.logs import get_logger
from stream.metadata.model import StreamMeta
from stream.protocol import (
    BookieCandidate,
    Code,
    EnsembleChange,
    choose_ensemble,
    choose_replacement,
    journal_required,
    next_to_replace,
    plan_ensemble_change,
)

log = get_logger(__name__)

# Bound on the replacements tried for one failed bookie (and on placements tried for a new
# fragment) before the attempt gives up.
MAX_CANDIDATES_TRIED = 8


def pick_replacement(
    pipeline: AddPipeline,
    failed: str,
    candidates: Sequence[BookieCandidate],
    rng: random.Random,
    tried: Collection[str],
    ack_quorum: int,
    options: WriterOptions,
) -> str:
    """Chooses the bookie to take `failed`'s place in `pipeline`'s ensemble: never a failed
    one nor one `tried` already, never one replaced away by a change the metadata does not
    hold yet (`AddPipeline.unstored_away`), a quarantined one only when nothing else
    qualifies, and one with the journal on when the ack quorum requires it. Raises
    `NotEnoughBookiesError`."""
    ensemble = pipeline.ensemble
    exclude = {*pipeline.failed, *tried}
    if options.protections.spare_holders:
        exclude |= pipeline.unstored_away

    def choose(exclude: set[str]) -> str:
        return choose_replacement(
            ensemble,
            ensemble.index(failed),
            candidates,
            rng,
            exclude=exclude,
            needs_journal=journal_required(ack_quorum),
        )

    try:
        return choose(exclude=exclude | pipeline.quarantined)
    except NotEnoughBookiesError:
        if pipeline.quarantined <= exclude:
            raise
    return choose(exclude=exclude)


@dataclass(frozen=True)
class BookiePlacement:
    """What placing or replacing bookies needs: the stream's name (for errors), the ports, and
    the term the new-member truncations carry, read at each send (the writer's current one)."""

    stream: str
    transport: BookieTransport
    metadata: MetadataPort
    rng: random.Random
    options: WriterOptions
    term: Callable[[], int]


async def replace_bookie(
    pipeline: AddPipeline,
    failed: str,
    failed_bookies: Collection[str],
    how: BookiePlacement,
    *,
    ack_quorum: int,
    moot: Callable[[], bool],
    truncate_at_most: int | None = None,
) -> tuple[EnsembleChange, str] | None:
    """Replaces `failed` in `pipeline`'s ensemble, the one loop of the writer's ensemble change
    and the recovery's local one: waits while it is pinned (it acked entries not yet at WQ),
    picks a replacement, truncates it after LAFR (or `truncate_at_most`) and applies the change
    to the pipeline; returns the change and the replacement, which gets no entries until the
    caller unblocks it (the writer first commits the change by CAS). Returns None when the
    pipeline should replace another failed bookie of `failed_bookies` first, when `failed`
    left the ensemble, or once `moot()` (the caller moved on; it may raise instead). Raises
    `NotEnoughBookiesError` past `ensemble_change_deadline_s` or `MAX_CANDIDATES_TRIED`
    replacements tried, `Fenced` when a replacement knows a newer term."""
    options = how.options
    loop = asyncio.get_running_loop()
    deadline = loop.time() + options.ensemble_change_deadline_s
    tried: set[str] = set()
    while True:
        if moot():
            return None
        if loop.time() > deadline or len(tried) >= MAX_CANDIDATES_TRIED:
            raise NotEnoughBookiesError(
                "no bookie can replace a failed one",
                stream=how.stream,
                bookie=failed,
                ensemble=list(pipeline.ensemble),
            )
        pinned = pipeline.pending.pinned_bookies()
        if failed in pinned:
            if replacement_choice(pipeline.ensemble, failed_bookies, pinned, options) != failed:
                return None  # another failed bookie can be replaced now: that one first
            # It acked committed entries not yet at WQ: wait for them to get there.
            await pipeline.wait_progress(0.05)
            continue
        if failed not in pipeline.ensemble:
            return None  # an earlier change already replaced it
        candidates = await how.metadata.available_bookies()
        try:
            replacement = pick_replacement(
                pipeline, failed, candidates, how.rng, tried, ack_quorum, options
            )
        except NotEnoughBookiesError:
            await asyncio.sleep(options.retry_backoff_s)
            continue
        tried.add(replacement)
        after = pipeline.lafr if truncate_at_most is None else min(truncate_at_most, pipeline.lafr)
        refused = await truncate_members(
            how.transport,
            pipeline.stream_id,
            how.term(),
            [replacement],
            after,
            options,
            enabled=options.protections.new_member_truncation,
        )
        if refused or pipeline.closed:
            continue  # a closed pipeline: the check at the top says what the caller wants
        pinned = pipeline.pending.pinned_bookies()
        change = plan_ensemble_change(
            pipeline.fragments, failed, replacement, lafr=pipeline.lafr, pinned=pinned
        )
        if change is None:
            continue
        pipeline.apply_change(change)
        return change, replacement


async def place_ensemble(
    how: BookiePlacement,
    meta: StreamMeta,
    truncate_after: int,
    *,
    exclude: Collection[str] = (),
    members: Collection[str] = (),
) -> tuple[str, ...]:
    """Returns a freshly placed ensemble for `meta` (never a bookie of `exclude`) whose joining
    bookies (those not in `members`, which hold their state already) all took the new-member
    truncation after `truncate_after`; a bookie that refuses is left out of the next
    try. Raises `NotEnoughBookiesError` when too few bookies qualify or after
    `MAX_CANDIDATES_TRIED` tries, `Fenced` when one knows a newer term."""
    excluded = set(exclude)
    for _ in range(MAX_CANDIDATES_TRIED):
        candidates = await how.metadata.available_bookies()
        ensemble = choose_ensemble(
            candidates,
            meta.ensemble,
            how.rng,
            exclude=excluded,
            needs_journal=journal_required(meta.ack_quorum),
        )
        refused = await truncate_members(
            how.transport,
            meta.id,
            how.term(),
            [b for b in ensemble if b not in members],
            truncate_after,
            how.options,
            enabled=how.options.protections.new_member_truncation,
        )
        if not refused:
            return ensemble
        excluded.update(refused)
    raise NotEnoughBookiesError(
        "bookies refused to join a new fragment (the new-member truncation)", stream=how.stream
    )


def replacement_choice(
    ensemble: Sequence[str],
    failed: Collection[str],
    pinned: Collection[str],
    options: WriterOptions,
) -> str | None:
    """Returns the failed bookie of `ensemble` to replace next (`next_to_replace`: an unpinned
    one first), or None; in plain ensemble order with `replace_unpinned_first` off."""
    if not options.protections.replace_unpinned_first:
        pinned = ()
    return next_to_replace(ensemble, failed, pinned)


async def truncate_members(
    transport: BookieTransport,
    stream_id: int,
    term: int,
    bookies: Sequence[str],
    after_entry_id: int,
    options: WriterOptions,
    *,
    enabled: bool,
) -> list[str]:
    """Sends the new-member truncation `Truncate(after_entry_id)` with `term` to `bookies` in
    parallel; returns those that did not take it (an INVALID_TERM raises `Fenced`)."""
    if not enabled or not bookies:
        return []
    answers = await answers_or_none(
        transport.truncate(b, stream_id, term, after_entry_id, timeout_s=options.truncate_timeout_s)
        for b in bookies
    )
    refused = []
    for bookie_id, answer in zip(bookies, answers, strict=True):
        code = None if answer is None else int(answer.code)
        if answer is not None and code == Code.INVALID_TERM:
            raise Fenced(answer.bookie_term)
        if code != Code.OK:
            log.warning(
                "writer.truncate_refused",
                bookie=bookie_id,
                stream_id=stream_id,
                code=None if code is None else Code(code).name,
            )
            refused.append(bookie_id)
    return refused
