"""Which fragments a retention policy drops (docs/design.md §6): pure arithmetic over fragment
metadata, no I/O, no clock (the caller passes `now_ms`).

Rules, for a stream's fragments sorted by first entry id:
- Only whole fragments go, only the oldest ones (a prefix), and never the last fragment: the
  last one is open (a writer appends to it, or the next one will), and `trim_fragments` refuses
  it. Every fragment but the last is closed: its range ends where the next one starts.
- Age (`max_age_s`): a fragment whose last entry is at least `max_age_s` old goes, with every
  older one; the prefix stops at the first fragment that is younger or of unknown age.
- Size (`max_bytes`): the newest closed fragments whose bytes add up to at most `max_bytes`
  are kept; the older ones go. The last (open) fragment is kept on top, so a stream holds at
  most `max_bytes` plus one fragment.
- Both: whichever drops more. A fragment is deleted when either policy says so.
- Consumption (`keep_unconsumed`, Pulsar's backlog quota, Pravega's consumption-based
  retention): the age limit drops only fragments whose entries every durable cursor of the
  stream has consumed (all at or below each cursor's position); `max_bytes` is the bound on
  what cursors hold back, and past it the oldest go anyway (their cursors' readers then get
  `EntryTrimmedError`). A stream without cursors has nothing to hold.
- Unknowns never delete on a guess: a fragment with no recorded size counts 0 bytes (it keeps
  more, never less); one with no last entry timestamp takes the next fragment's creation time
  (its entries were all written before the next fragment existed), and without that its age
  is unknown and it stays.

Idle streams (apache/pulsar#9057): an open last fragment is never deleted, so a stream whose
writer went away would keep its last fragment forever. `idle_action` decides, from what the
last fragment's bookies hold, whether a takeover should close it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from stream.metadata.model import Fragment, RetentionPolicy
from stream.protocol.invariant import invariant


@dataclass(frozen=True)
class RetentionPlan:
    """What a policy drops from one stream: the oldest `delete_count` fragments, after which
    the first retained entry is `new_first_entry_id` (None when nothing goes). `by_age` and
    `by_size` are what each policy alone would drop (`delete_count` is the larger)."""

    delete_count: int
    new_first_entry_id: int | None
    by_age: int = 0
    by_size: int = 0
    # Fragments the age limit would drop that cursors hold back (`keep_unconsumed`).
    held_by_cursors: int = 0

    @property
    def empty(self) -> bool:
        """Returns whether nothing is to be deleted."""
        return self.delete_count == 0


NOTHING = RetentionPlan(0, None)


def max_age_ms(policy: RetentionPolicy) -> float | None:
    """Returns the policy's age limit in milliseconds, None when it has none."""
    return None if policy.max_age_s is None else policy.max_age_s * 1000.0


def effective_last_timestamp_ms(fragments: Sequence[Fragment], index: int) -> int | None:
    """Returns the timestamp that ages fragment `index`: its recorded last entry timestamp, else
    the creation time of the next fragment (an upper bound: entries are timestamped when
    appended, before the next fragment is created), else None (unknown)."""
    fragment = fragments[index]
    if fragment.last_timestamp_ms is not None:
        return fragment.last_timestamp_ms
    if index + 1 < len(fragments) and fragments[index + 1].created_ms > 0:
        return fragments[index + 1].created_ms
    return None


def is_expired(timestamp_ms: int | None, policy: RetentionPolicy, now_ms: int) -> bool:
    """Returns whether an entry stamped `timestamp_ms` is past the policy's age limit (False
    without an age limit or a timestamp)."""
    limit = max_age_ms(policy)
    if limit is None or timestamp_ms is None:
        return False
    return now_ms - timestamp_ms >= limit


def expired_by_age(fragments: Sequence[Fragment], policy: RetentionPolicy, now_ms: int) -> int:
    """Returns how many of the oldest fragments (never the last) are all past `max_age_s`."""
    if policy.max_age_s is None:
        return 0
    count = 0
    for index in range(len(fragments) - 1):
        if not is_expired(effective_last_timestamp_ms(fragments, index), policy, now_ms):
            break
        count += 1
    return count


def excess_by_size(fragments: Sequence[Fragment], policy: RetentionPolicy) -> int:
    """Returns how many of the oldest fragments go so that the closed fragments kept (all but
    the last) total at most `max_bytes`, keeping as many of the newest as fit."""
    if policy.max_bytes is None:
        return 0
    kept_bytes = 0
    # Newest closed fragment first; the first one that does not fit goes with all older ones.
    for index in range(len(fragments) - 2, -1, -1):
        kept_bytes += fragments[index].bytes or 0
        if kept_bytes > policy.max_bytes:
            return index + 1
    return 0


def consumed_by_all(fragments: Sequence[Fragment], cursor_positions: Iterable[int]) -> int | None:
    """Returns how many of the oldest fragments (never the last) every cursor has consumed,
    None when there is no cursor (nothing is held)."""
    lowest = min(cursor_positions, default=None)
    return None if lowest is None else fragments_below(fragments, lowest + 1)


def plan_retention(
    fragments: Sequence[Fragment],
    policy: RetentionPolicy | None,
    now_ms: int,
    cursor_positions: Iterable[int] = (),
) -> RetentionPlan:
    """Returns the plan of `policy` for a stream whose fragments (sorted by first entry id)
    are `fragments`, at wall-clock time `now_ms`; `cursor_positions` (the durable cursors'
    committed entry ids) count only when the policy keeps unconsumed fragments."""
    if policy is None or len(fragments) < 2:
        return NOTHING
    by_age = expired_by_age(fragments, policy, now_ms)
    held = 0
    if policy.keep_unconsumed and by_age:
        consumed = consumed_by_all(fragments, cursor_positions)
        if consumed is not None and consumed < by_age:
            held, by_age = by_age - consumed, consumed
    by_size = excess_by_size(fragments, policy)
    count = max(by_age, by_size)
    # Deleting the last fragment would leave the stream without a place to write.
    invariant(count < len(fragments), "retention never plans the last fragment", count=count)
    held = max(0, held - max(0, by_size - by_age))  # size drops some of them anyway
    if count == 0:
        return RetentionPlan(0, None, by_age, by_size, held)
    return RetentionPlan(count, fragments[count].first_entry_id, by_age, by_size, held)


def held_back(
    fragments: Sequence[Fragment],
    policy: RetentionPolicy | None,
    now_ms: int,
    cursor_positions: Mapping[str, int],
) -> dict[str, tuple[int, int]]:
    """Returns, per cursor, the fragments (count, recorded bytes) that the age limit would
    drop but that cursor has not consumed: what it alone holds back, `max_bytes` aside."""
    if policy is None or not policy.keep_unconsumed or len(fragments) < 2:
        return {}
    expired = expired_by_age(fragments, policy, now_ms)
    held = {}
    for name, position in cursor_positions.items():
        kept = fragments[min(fragments_below(fragments, position + 1), expired) : expired]
        held[name] = (len(kept), sum(f.bytes or 0 for f in kept))
    return held


def fragments_below(fragments: Sequence[Fragment], before_entry_id: int) -> int:
    """Returns how many of the oldest fragments (never the last) hold only entries below
    `before_entry_id`: what an explicit `trim(before_entry_id)` deletes."""
    count = 0
    for index in range(len(fragments) - 1):
        if fragments[index + 1].first_entry_id - 1 >= before_entry_id:
            break
        count += 1
    return count


class IdleAction(enum.Enum):
    """What to do with the open last fragment of a stream that has no live writer."""

    KEEP = "keep"  # no age limit, or the fragment cannot be that old yet
    EMPTY = "empty"  # nothing was written to it: closing it would only add a fragment
    YOUNG = "young"  # its newest entry is still within the age limit
    UNKNOWN = "unknown"  # its bookies did not say enough; ask again next round
    TAKE_OVER = "take over"  # run a takeover so it closes and can be deleted


def idle_candidate(last: Fragment, policy: RetentionPolicy | None, now_ms: int) -> bool:
    """Returns whether an idle stream's last fragment may be past the age limit, from metadata
    alone (worth asking its bookies): it has an age limit and was created at least that long
    ago (its entries were appended after it was created)."""
    if policy is None or policy.max_age_s is None or last.closed:
        return False
    return is_expired(last.created_ms, policy, now_ms)


def idle_action(
    last: Fragment,
    policy: RetentionPolicy | None,
    now_ms: int,
    *,
    highest_entry_id: int | None,
    newest_timestamp_ms: int | None,
) -> IdleAction:
    """Returns what to do with the last fragment of a stream with no live writer.
    `highest_entry_id`: the highest entry id its bookies hold (-1 for none; None when too few
    answered to tell), `newest_timestamp_ms`: the timestamp of that entry (None if unread)."""
    if policy is None or not idle_candidate(last, policy, now_ms):
        return IdleAction.KEEP
    if highest_entry_id is None:
        return IdleAction.UNKNOWN
    if highest_entry_id < last.first_entry_id:
        # E.g. the fresh fragment a previous idle takeover opened: taking it over again would
        # add a fragment and a term on every round, forever.
        return IdleAction.EMPTY
    if newest_timestamp_ms is None:
        return IdleAction.UNKNOWN
    if not is_expired(newest_timestamp_ms, policy, now_ms):
        return IdleAction.YOUNG
    return IdleAction.TAKE_OVER
