"""Decisions of a takeover's recovery (docs/design.md §5, steps 2-3): when fencing is complete and
where reading starts, what each recovery read proves, and where the truncate no-op goes.

Every tally counts the first answer from each member and ignores later ones: a retry after an
unknown answer belongs to a new attempt with a new tally. Callers feed a timeout or transport
error as code `None`. Decisions are terminal: once a tally leaves PENDING, later answers change
nothing (the caller has already acted on it).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from stream.errors import InvalidArgumentError
from stream.protocol.codes import Code, ResponseClass, classify
from stream.protocol.invariant import invariant
from stream.protocol.quorum import QuorumConfig

T = TypeVar("T")
M = TypeVar("M", bound=Hashable)


class FenceOutcome(Enum):
    """Where fencing stands (three-way, like a vote: won, lost, pending)."""

    PENDING = "pending"
    COMPLETE = "complete"  # EC positives: no AQ of the ensemble can still accept the old term
    FAILED = "failed"  # AQ unknowns: EC is out of reach; give up and retry later


class FenceTally:
    """Collects `Fence` answers from the captured last fragment's ensemble (indices 0..E-1).

    COMPLETE at EC positives; FAILED once AQ members answered unknown, which is exactly when EC
    can no longer be reached. An explicit negative counts as unknown: a fence creates the
    stream on a bookie that never saw it, so it has no negative answer.

    Reading starts after `start_entry_id = max(highest LAFR among the positives,
    last_fragment_first_entry_id - 1)`. LAC does not move the start: an entry at or below LAC
    may still be short of its whole write set, and recovery must rewrite it there. Entries
    before the last fragment reached WQ before their fragment was closed.
    """

    def __init__(self, config: QuorumConfig, *, last_fragment_first_entry_id: int) -> None:
        if last_fragment_first_entry_id < 0:
            raise InvalidArgumentError(
                "last_fragment_first_entry_id must be >= 0",
                first_entry_id=last_fragment_first_entry_id,
            )
        self._config = config
        self._last_fragment_first_entry_id = last_fragment_first_entry_id
        self._answered: set[int] = set()
        self._positives = 0
        self._unknowns = 0
        self._highest_lac = -1
        self._highest_lafr = -1
        self._outcome = FenceOutcome.PENDING
        self._invalid_term_seen = False

    @property
    def invalid_term_seen(self) -> bool:
        """Return whether a member answered INVALID_TERM: a newer writer exists, so the caller
        stops instead of retrying."""
        return self._invalid_term_seen

    @property
    def outcome(self) -> FenceOutcome:
        """Return PENDING, COMPLETE or FAILED."""
        return self._outcome

    @property
    def positives(self) -> int:
        """Return how many members answered OK."""
        return self._positives

    @property
    def unknowns(self) -> int:
        """Return how many members answered anything but OK (or timed out)."""
        return self._unknowns

    @property
    def frozen_lac(self) -> int:
        """Return the LAC that recovery write-backs carry: the highest LAC among the positives
        at completion, frozen for the whole recovery."""
        invariant(self._outcome is FenceOutcome.COMPLETE, "fencing is not complete")
        return self._highest_lac

    @property
    def start_entry_id(self) -> int:
        """Return the id after which recovery reads start (COMPLETE only)."""
        invariant(self._outcome is FenceOutcome.COMPLETE, "fencing is not complete")
        return max(self._highest_lafr, self._last_fragment_first_entry_id - 1)

    def on_response(
        self, bookie_index: int, code: int | None, *, lac: int = -1, lafr: int = -1
    ) -> FenceOutcome:
        """Count the answer of ensemble index `bookie_index` (`lac`/`lafr` from its response,
        used only when `code` is OK) and return the outcome."""
        invariant(
            0 <= bookie_index < self._config.ensemble,
            "fence answer from outside the ensemble",
            bookie_index=bookie_index,
            ensemble=self._config.ensemble,
        )
        if code == Code.INVALID_TERM:
            self._invalid_term_seen = True  # noted even once decided: a newer writer exists
        if self._outcome is not FenceOutcome.PENDING or bookie_index in self._answered:
            return self._outcome
        self._answered.add(bookie_index)
        if classify(code) is ResponseClass.POSITIVE:
            self._positives += 1
            self._highest_lac = max(self._highest_lac, lac)
            self._highest_lafr = max(self._highest_lafr, lafr)
            if self._positives >= self._config.ensemble_coverage:
                self._outcome = FenceOutcome.COMPLETE
        else:
            self._unknowns += 1
            if self._unknowns >= self._config.ack_quorum:
                self._outcome = FenceOutcome.FAILED
        return self._outcome


class ReadOutcome(Enum):
    """What the recovery reads of one entry prove."""

    PENDING = "pending"
    RECOVERABLE = "recoverable"  # enough positives: write the entry back
    ENDED = "ended"  # QC explicit negatives: the previous term ended just before this entry
    UNKNOWN = "unknown"  # neither can be reached any more: abort this attempt, never guess


class RecoveryReadTally(Generic[M, T]):
    """Collects the recovery-read answers for one entry from its write set.

    RECOVERABLE at `positives_required` positives (1 by default, as BookKeeper and the verified
    TLA+ spec; BP-46's table asks for AQ: pass `config.ack_quorum`). ENDED at QC explicit
    negatives while short of that: then no ack quorum of the write set can hold the entry, so
    it was never acknowledged. UNKNOWN as soon as neither can be reached with the members yet
    to answer (with everyone answered: neither was reached). BP-46 also aborts at QC unknowns,
    sometimes while a decision is still reachable; aborting only when none is reachable is as
    safe and more live. The two thresholds never both hold when `positives_required` is AQ;
    with 1, whichever is reached first decides, and both are safe.

    Members in limbo answer UNKNOWN (`Code.UNKNOWN`) where they would say "absent"
    (`limbo_code`); `blocked_by_limbo` tells when only those answers keep the entry UNKNOWN
    (`limbo_blocked`). With `accept_loss` (an operator's `recover --accept-loss`, docs/design.md §4)
    such an entry is ENDED instead: whatever the limbo members may have lost is given up.
    """

    def __init__(
        self,
        config: QuorumConfig,
        write_set: Sequence[M],
        *,
        positives_required: int = 1,
        accept_loss: bool = False,
    ) -> None:
        members = tuple(write_set)
        if len(members) != config.write_quorum or len(set(members)) != len(members):
            raise InvalidArgumentError(
                "a write set holds WQ distinct members",
                write_set=members,
                write_quorum=config.write_quorum,
            )
        if not 1 <= positives_required <= config.ack_quorum:
            raise InvalidArgumentError(
                "positives_required must lie in [1, ack_quorum]",
                positives_required=positives_required,
                ack_quorum=config.ack_quorum,
            )
        self._config = config
        self._members = frozenset(members)
        self._positives_required = positives_required
        self._accept_loss = accept_loss
        self._limbo: list[M] = []
        self._answered: set[M] = set()
        self._positives = 0
        self._negatives = 0
        self._unknowns = 0
        self._entry: T | None = None
        self._outcome = ReadOutcome.PENDING
        self._invalid_term_seen = False

    @property
    def invalid_term_seen(self) -> bool:
        """Return whether a member answered INVALID_TERM: a newer writer exists, so the caller
        stops instead of retrying."""
        return self._invalid_term_seen

    @property
    def outcome(self) -> ReadOutcome:
        """Return PENDING, RECOVERABLE, ENDED or UNKNOWN."""
        return self._outcome

    @property
    def entry(self) -> T:
        """Return the entry read from the first positive (RECOVERABLE only)."""
        invariant(self._outcome is ReadOutcome.RECOVERABLE, "entry is not recoverable")
        return self._entry  # type: ignore[return-value]  # set with the first positive

    @property
    def limbo_members(self) -> tuple[M, ...]:
        """Return the members that answered UNKNOWN because they are in limbo, in answer
        order."""
        return tuple(self._limbo)

    @property
    def blocked_by_limbo(self) -> bool:
        """Return whether the limbo members' UNKNOWNs alone leave this entry undecided (with
        `accept_loss`: whether they alone made it ENDED)."""
        return self._outcome in (ReadOutcome.UNKNOWN, ReadOutcome.ENDED) and limbo_blocked(
            self._config, self._positives, self._negatives, self._unknowns, len(self._limbo)
        )

    @property
    def counts(self) -> tuple[int, int, int]:
        """Return (positives, explicit negatives, unknowns) counted so far."""
        return self._positives, self._negatives, self._unknowns

    def on_response(self, member: M, code: int | None, entry: T | None = None) -> ReadOutcome:
        """Count `member`'s answer (`entry` is the entry read, required when `code` is OK)
        and return the outcome."""
        invariant(member in self._members, "read answer from outside the write set", member=member)
        if code == Code.INVALID_TERM:
            self._invalid_term_seen = True  # noted even once decided: a newer writer exists
        if self._outcome is not ReadOutcome.PENDING or member in self._answered:
            return self._outcome
        self._answered.add(member)
        response_class = classify(code)
        if response_class is ResponseClass.POSITIVE:
            invariant(entry is not None, "a positive read carries the entry", member=member)
            if self._positives == 0:
                self._entry = entry
            self._positives += 1
        elif response_class is ResponseClass.EXPLICIT_NEGATIVE:
            self._negatives += 1
        else:
            self._unknowns += 1
            if code == Code.UNKNOWN:
                self._limbo.append(member)
        self._outcome = read_outcome(
            self._config,
            self._positives,
            self._negatives,
            self._unknowns,
            positives_required=self._positives_required,
        )
        if (
            self._accept_loss
            and self._outcome is ReadOutcome.UNKNOWN
            and limbo_blocked(
                self._config, self._positives, self._negatives, self._unknowns, len(self._limbo)
            )
        ):
            self._outcome = ReadOutcome.ENDED
        return self._outcome


def limbo_blocked(
    config: QuorumConfig, positives: int, negatives: int, unknowns: int, limbo_unknowns: int
) -> bool:
    """Return whether an entry's recovery reads are short of a decision only because members
    in limbo answered UNKNOWN: every member of the write set answered, none holds the entry,
    fewer than QC said "absent", and every other answer is a limbo UNKNOWN (`Code.UNKNOWN`,
    which only `limbo_code` produces; `limbo_unknowns` of the `unknowns`). A timeout or a
    transport error is not one: that member may hold the entry.

    Retrying cannot decide such an entry while those members stay in limbo, and limbo clears
    only once a recovery completes (docs/design.md §4). Counting the limbo answers as explicit
    negatives would end the previous term here (WQ >= QC negatives): that is what an
    accept-loss recovery does, giving up whatever those members may have lost.
    """
    invariant(0 <= limbo_unknowns <= unknowns, "limbo unknowns are unknowns", limbo=limbo_unknowns)
    return (
        limbo_unknowns > 0
        and positives == 0
        and unknowns == limbo_unknowns
        and negatives < config.quorum_coverage
        and negatives + limbo_unknowns == config.write_quorum
    )


def read_outcome(
    config: QuorumConfig,
    positives: int,
    negatives: int,
    unknowns: int,
    *,
    positives_required: int = 1,
) -> ReadOutcome:
    """Return the outcome of one entry's recovery reads from the counts of distinct members
    of its write set that answered positive, explicit negative and unknown."""
    wq = config.write_quorum
    answered = positives + negatives + unknowns
    invariant(answered <= wq, "more answers than write set members", answered=answered)
    if positives >= positives_required:
        return ReadOutcome.RECOVERABLE
    qc = config.quorum_coverage
    if negatives >= qc:
        return ReadOutcome.ENDED
    remaining = wq - answered
    if positives + remaining < positives_required and negatives + remaining < qc:
        return ReadOutcome.UNKNOWN
    return ReadOutcome.PENDING


class RecoveryStatus(Enum):
    """Where the forward scan of recovery reads stands."""

    READING = "reading"  # the next entry's outcome is not known yet
    ENDED = "ended"  # the end is found: write back, then the truncate no-op
    ABORTED = "aborted"  # an entry's outcome is UNKNOWN: abort this attempt and retry later


@dataclass(frozen=True, slots=True)
class RecoveryScan:
    """The result of `scan_recovery_reads`."""

    status: RecoveryStatus
    # Highest id such that it and every id after the start is RECOVERABLE (start if none).
    last_recovered_entry_id: int
    # The first id whose outcome is not RECOVERABLE: awaited (READING), the end (ENDED), or
    # the one that made the attempt abort (ABORTED).
    stopped_at_entry_id: int

    @property
    def truncate_entry_id(self) -> int:
        """Return the id of the NOOP|TRUNCATE entry: right after the last recovered one."""
        invariant(self.status is RecoveryStatus.ENDED, "the end is not found yet")
        return self.last_recovered_entry_id + 1


def scan_recovery_reads(start_entry_id: int, outcomes: Iterable[ReadOutcome]) -> RecoveryScan:
    """Return where recovery stands given the read outcomes of entries `start_entry_id + 1`,
    `+ 2`, ... in id order. Outcomes after the first non-RECOVERABLE one are ignored: reads
    issued ahead in parallel past the end prove nothing."""
    if start_entry_id < -1:
        raise InvalidArgumentError("start_entry_id must be >= -1", entry_id=start_entry_id)
    entry_id = start_entry_id + 1
    for outcome in outcomes:
        if outcome is ReadOutcome.RECOVERABLE:
            entry_id += 1
            continue
        status = {
            ReadOutcome.PENDING: RecoveryStatus.READING,
            ReadOutcome.ENDED: RecoveryStatus.ENDED,
            ReadOutcome.UNKNOWN: RecoveryStatus.ABORTED,
        }[outcome]
        return RecoveryScan(status, entry_id - 1, entry_id)
    return RecoveryScan(RecoveryStatus.READING, entry_id - 1, entry_id)


def recovery_waits_for(
    config: QuorumConfig,
    ensemble: Sequence[str],
    down: Collection[str],
    limbo: Collection[str],
    writer: str | None,
) -> str:
    """Return, for a stream IN_RECOVERY, what its takeover waits for (`streamctl info`): the
    fence needs EC = E - AQ + 1 answers from the last fragment's `ensemble` (`down`: not
    registered), an entry after the end needs QC explicit negatives that members in `limbo`
    cannot give, and otherwise a takeover runs (`writer` registered) or one stopped midway."""
    up = [b for b in ensemble if b not in down]
    if len(up) < config.ensemble_coverage:
        return (
            f"bookies: a takeover needs {config.ensemble_coverage} of the last fragment's "
            f"{len(ensemble)} to answer; down: {', '.join(b for b in ensemble if b in down)}"
        )
    stuck = [b for b in ensemble if b in limbo]
    if stuck:
        return (
            f"bookies in limbo ({', '.join(stuck)}): a takeover cannot tell where the previous "
            "term ended until they are repaired; if it fails with StreamInLimboError, see "
            "`streamctl recover --accept-loss`"
        )
    if writer is not None:
        return f"the takeover of writer {writer}, running"
    return (
        "a takeover that stopped midway: the next writer (or the auditor, for an idle "
        "stream) completes it"
    )
