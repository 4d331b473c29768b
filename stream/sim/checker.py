"""The simulation's checker: the four safety properties of docs/design.md §10, evaluated from what
the application saw (acknowledgments, reads) and from the bookies' contents, and the
timestamps' order.

1. `durability`: no acknowledged entry is ever lost or changed. Two acknowledgments of one
   entry id with different payloads, or a final read (after a last takeover fixed the end)
   that does not return an acknowledged entry with its payload, break it.
2. `no-divergence`: every read of entry e that returns data, from any bookie of its write set
   (per the metadata of the moment), at any time after e is acknowledged, returns the same
   bytes. Checked on every read the readers make and by scanning every bookie after every
   step of the run and at its end.
3. `reader-agreement`: all readers see the same sequence of non-no-op entries: for every
   entry id, every reader that covered it returned the same payload, or all skipped it.
4. `superseded-writer`: a writer whose term was superseded gets no acknowledgment for an entry
   at or after the first entry id of a newer term once that term's recovery fixed the end
   (its `finish_recovery` committed).
5. `monotone-time`: entry timestamps never go backwards within the stream (docs/design.md
   "Time"): every read returns non-decreasing timestamps in entry id order, although each
   client's clock is skewed (`Simulation` gives each its own offset).
6. `no-dirty-read`: a reader never returns an entry that was never committed: every entry
   id a reader returned data for is within the end the final recovery fixed.
7. `write-quorum`: every entry of a closed fragment (every fragment but the last) is on its
   whole write set once the writer or recovery that closed it reported success; checked at
   the end of a run, every fault healed and every bookie up.
8. `log-divergence`: up to the LAC, every bookie of an entry's write set that holds the entry
   holds the same bytes (and flags), acknowledged to the application or not. Checked by the
   same scans as property 2.

Trims and deletes (docs/design.md §5) take entries away on purpose: an acknowledged entry below
the stream's first retained entry is trimmed, not lost (property 1), and a reader that returns
nothing for an id below it read a trimmed range, not a no-op (properties 2 and 3). A deleted
stream has no end to fix and nothing to read: only what was judged while it lived stands.

A violation carries the property, the virtual time and the details. The checker only
observes: it never changes what the simulation does.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from stream.metadata.model import Fragment, StreamMeta
from stream.protocol import EntryFlag, QuorumConfig, fragment_index_for
from stream.sim.fault_history import FaultHistory
from stream.sim.give_up import GiveUp, Sampled, needless_give_up
from stream.sim.trace import Trace
from stream.wire import bookie_pb2 as pb

DURABILITY = "durability"
NO_DIVERGENCE = "no-divergence"
READER_AGREEMENT = "reader-agreement"
SUPERSEDED_WRITER = "superseded-writer"
MONOTONE_TIME = "monotone-time"
NO_DIRTY_READ = "no-dirty-read"
WRITE_QUORUM = "write-quorum"
LOG_DIVERGENCE = "log-divergence"
# Not a safety property (docs/design.md §10 progress): with every fault healed and E writable
# bookies up, a writer left appends neither acknowledged nor failed: a stall with no error.
PROGRESS = "progress"
# Not a safety property (docs/design.md §10 progress): a writer failed its ensemble change with
# NotEnoughBookiesError, waiting on a pinned member, while an unpinned failed member could have
# been replaced the whole time (`stream.sim.give_up`).
NEEDLESS_GIVE_UP = "needless-give-up"
# Not a safety property: the run could not finish its final takeover or read with every
# fault healed (a bug or a protocol that cannot make progress).
LIVENESS = "liveness"

PROPERTIES = (
    DURABILITY,
    NO_DIVERGENCE,
    READER_AGREEMENT,
    SUPERSEDED_WRITER,
    MONOTONE_TIME,
    NO_DIRTY_READ,
    WRITE_QUORUM,
    LOG_DIVERGENCE,
)

_NOOP = int(EntryFlag.NOOP)
# A reader that skipped an id saw a no-op there.
_SKIPPED = None


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken property: which, when (virtual seconds) and what was seen."""

    property: str
    time_s: float
    details: str

    def __str__(self) -> str:
        return f"{self.property} at t={self.time_s:.4f}s: {self.details}"


@dataclass(frozen=True, slots=True)
class Ack:
    """One acknowledgment the application received."""

    writer: str
    term: int
    entry_id: int
    payload: bytes
    time_s: float


class Checker:
    """Collects what the run observed and reports violations (at most `max_violations`)."""

    def __init__(
        self,
        trace: Trace,
        now: Callable[[], float],
        *,
        max_violations: int = 20,
        stream: str = "",
    ) -> None:
        """`stream` names the stream judged in every violation (a run's further streams)."""
        self._trace = trace
        self._stream = stream
        self._now = now
        self._max = max_violations
        self.violations: list[Violation] = []
        self.acked: dict[int, Ack] = {}
        self.ack_count = 0
        # term -> (first entry id of the term, virtual time its recovery committed)
        self.fixed: dict[int, tuple[int, float]] = {}
        # entry id -> (payload or None for a skipped no-op, reader, time)
        self.seen: dict[int, tuple[bytes | None, str, float]] = {}
        self._reported_divergence: set[tuple[int, str]] = set()
        self._reported_log: set[int] = set()
        # The highest first retained entry the stream's metadata named (trims and retention).
        self.first_retained = 0
        self.deleted = False

    # ------------------------------------------------------------------ reporting

    def violate(self, prop: str, details: str) -> None:
        """Records a violation of `prop` now."""
        if self._stream:
            details = f"stream {self._stream}: {details}"
        self._trace.record("VIOLATION", p=prop, d=details)
        if len(self.violations) < self._max:
            self.violations.append(Violation(prop, self._now(), details))

    # ------------------------------------------------------------------ observations

    def on_term_fixed(self, meta: StreamMeta) -> None:
        """Notes every (term, first entry id) of `meta`'s term history not seen before: that
        term's recovery fixed the previous term's end now."""
        for term, first in meta.term_history:
            if term not in self.fixed:
                self.fixed[term] = (first, self._now())
                self._trace.record("fixed", t=term, first=first)

    def on_trim(self, first_retained: int) -> None:
        """Notes the stream's first retained entry (its metadata moved it): acknowledged
        entries below it are gone on purpose, and reads no longer return them."""
        if first_retained > self.first_retained:
            self.first_retained = first_retained
            self._trace.record("trimmed_to", first=first_retained)

    def on_deleted(self) -> None:
        """Notes that the stream was deleted: `final` has nothing left to judge."""
        self.deleted = True
        self._trace.record("deleted")

    def on_ack(self, writer: str, term: int, entry_id: int, payload: bytes) -> None:
        """Records one acknowledgment and checks properties 1 and 4 against it."""
        now = self._now()
        self.ack_count += 1
        self._trace.record("ack", w=writer, t=term, e=entry_id)
        for newer, (first, fixed_at) in self.fixed.items():
            # Strictly after: an acknowledgment reaches the application one loop turn after
            # the writer decided it, so one at the very instant of the fix may predate it.
            if newer > term and entry_id >= first and fixed_at < now:
                self.violate(
                    SUPERSEDED_WRITER,
                    f"writer {writer} (term {term}) got entry {entry_id} acknowledged after "
                    f"term {newer}'s recovery fixed the end (its first entry {first}, "
                    f"at t={fixed_at:.4f}s)",
                )
                break
        previous = self.acked.get(entry_id)
        if previous is not None and previous.payload != payload:
            self.violate(
                DURABILITY,
                f"entry {entry_id} acknowledged twice with different payloads: "
                f"{previous.payload!r} (writer {previous.writer}, term {previous.term}) then "
                f"{payload!r} (writer {writer}, term {term})",
            )
        if previous is None:
            self.acked[entry_id] = Ack(writer, term, entry_id, payload, now)

    def on_read(
        self, reader: str, first: int, last: int, entries: Iterable[tuple[int, bytes]]
    ) -> None:
        """Records a reader's result for ids `first..last` (no-ops left out, as the reader
        returns them) and checks properties 2 and 3 against it."""
        now = self._now()
        got = dict(entries)
        self._trace.record("read_ok", r=reader, first=first, last=last, n=len(got))
        for entry_id in range(first, last + 1):
            payload = got.get(entry_id, _SKIPPED)
            if payload is _SKIPPED and entry_id < self.first_retained:
                continue  # trimmed while the reader read: not a no-op it skipped
            ack = self.acked.get(entry_id)
            if ack is not None and payload != ack.payload:
                self.violate(
                    NO_DIVERGENCE,
                    f"reader {reader} read entry {entry_id} as "
                    f"{'a no-op' if payload is None else repr(payload)}; it was acknowledged "
                    f"as {ack.payload!r} (writer {ack.writer}, term {ack.term})",
                )
            earlier = self.seen.get(entry_id)
            if earlier is None:
                self.seen[entry_id] = (payload, reader, now)
            elif earlier[0] != payload:
                self.violate(
                    READER_AGREEMENT,
                    f"entry {entry_id}: reader {earlier[1]} saw "
                    f"{'a no-op' if earlier[0] is None else repr(earlier[0])}, reader {reader} "
                    f"saw {'a no-op' if payload is None else repr(payload)}",
                )

    def on_timestamps(self, reader: str, stamps: Sequence[tuple[int, int]]) -> None:
        """Checks property 5 on a read's `(entry id, timestamp)` pairs, in id order."""
        for (before, earlier), (after, later) in zip(stamps, stamps[1:], strict=False):
            if later < earlier:
                self.violate(
                    MONOTONE_TIME,
                    f"reader {reader}: entry {after} is stamped {later}, before entry "
                    f"{before} ({earlier})",
                )
                return

    def on_give_up(
        self, give_up: GiveUp, seen: Sampled, history: FaultHistory, spares: Collection[str]
    ) -> None:
        """Judges a writer's failed ensemble change once (`needless_give_up`): a needless
        one violates `NEEDLESS_GIVE_UP`."""
        if seen.judged:
            return
        self._trace.record("give_up", w=give_up.writer, t=give_up.term, b=give_up.waited_on)
        details = needless_give_up(give_up, seen, history, spares)
        seen.judged = True
        if details is not None:
            self.violate(NEEDLESS_GIVE_UP, details)

    # ------------------------------------------------------------------ bookie scans

    def scan_bookies(
        self,
        stream_id: int,
        config: QuorumConfig,
        fragments: Sequence[Fragment],
        held: Callable[[str, int, int], pb.Entry | None],
    ) -> None:
        """Checks property 2 on every acknowledged entry: each bookie of its write set under
        `fragments` that would serve it now (`held(bookie, stream, entry)`) holds its bytes."""
        if not fragments or not self.acked:
            return
        firsts = [(f.first_entry_id, f.ensemble) for f in fragments]
        for entry_id, ack in self.acked.items():
            if entry_id < firsts[0][0]:
                continue
            ensemble = firsts[fragment_index_for(firsts, entry_id)][1]
            write_set = config.write_set_bookies(ensemble, entry_id)
            for bookie_id in write_set:
                entry = held(bookie_id, stream_id, entry_id)
                if entry is None:
                    continue
                if entry.payload != ack.payload or entry.flags & _NOOP:
                    key = (entry_id, bookie_id)
                    if key in self._reported_divergence:
                        continue
                    self._reported_divergence.add(key)
                    what = "a no-op" if entry.flags & _NOOP else repr(entry.payload)
                    self.violate(
                        NO_DIVERGENCE,
                        f"bookie {bookie_id} (write set {list(write_set)}) "
                        f"holds entry {entry_id} as {what}; it was acknowledged as "
                        f"{ack.payload!r} (writer {ack.writer}, term {ack.term})",
                    )

    def scan_log(
        self,
        config: QuorumConfig,
        fragments: Sequence[Fragment],
        first_retained: int,
        lac: int,
        held: Callable[[str, int], pb.Entry | None],
    ) -> None:
        """Checks property 8: for every retained entry up to `lac`, the bookies of its write
        set under `fragments` that hold it (`held(bookie, entry)`) hold the same bytes."""
        if not fragments:
            return
        firsts = [(f.first_entry_id, f.ensemble) for f in fragments]
        for entry_id in range(max(first_retained, firsts[0][0]), lac + 1):
            if entry_id in self._reported_log:
                continue
            ensemble = firsts[fragment_index_for(firsts, entry_id)][1]
            copies: dict[tuple[bytes, int], str] = {}
            for bookie_id in config.write_set_bookies(ensemble, entry_id):
                entry = held(bookie_id, entry_id)
                if entry is not None:
                    copies.setdefault((entry.payload, entry.flags & _NOOP), bookie_id)
            if len(copies) > 1:
                self._reported_log.add(entry_id)
                seen = ", ".join(
                    f"{bookie} {'a no-op' if noop else repr(payload)}"
                    for (payload, noop), bookie in copies.items()
                )
                self.violate(
                    LOG_DIVERGENCE,
                    f"entry {entry_id} (at or below the LAC {lac}) differs between bookies of "
                    f"its write set: {seen}",
                )

    # ------------------------------------------------------------------ the end of a run

    def check_write_quorum(
        self,
        config: QuorumConfig,
        fragments: Sequence[Fragment],
        first_retained: int,
        held: Callable[[str, int], pb.Entry | None],
        excused: Collection[str] = (),
    ) -> None:
        """Checks property 7: every retained entry of every fragment but the last is held by
        every bookie of its write set (but those `excused`: see `write_quorum_gap`)."""
        missing = write_quorum_gap(config, fragments, first_retained, held, excused)
        if missing is not None:
            self.violate(WRITE_QUORUM, missing)

    def final(
        self, end_entry_id: int, final_read: Mapping[int, bytes] | None, *, source: str = ""
    ) -> None:
        """Checks property 1 against the final view of `0..end_entry_id` after the last
        takeover fixed the end: the final reader's (no-ops left out), or what `source` says
        when the reader could not read it all (None: nothing to compare)."""
        if self.deleted:
            return
        source = source or "the final read gives"
        for entry_id, (payload, reader, seen_at) in sorted(self.seen.items()):
            if entry_id > end_entry_id and payload is not None:
                self.violate(
                    NO_DIRTY_READ,
                    f"reader {reader} returned entry {entry_id} ({payload!r}) at "
                    f"t={seen_at:.4f}s; the final recovery ended the stream at {end_entry_id}",
                )
                break
        for entry_id in sorted(self.acked):
            ack = self.acked[entry_id]
            if entry_id < self.first_retained:
                continue  # trimmed, not lost
            if entry_id > end_entry_id:
                self.violate(
                    DURABILITY,
                    f"entry {entry_id} ({ack.payload!r}, writer {ack.writer}, term {ack.term}) "
                    f"was acknowledged but the final recovery ended the stream at "
                    f"{end_entry_id}",
                )
                continue
            if final_read is None:
                continue
            payload = final_read.get(entry_id)
            if payload != ack.payload:
                self.violate(
                    DURABILITY,
                    f"entry {entry_id} was acknowledged as {ack.payload!r} (writer "
                    f"{ack.writer}, term {ack.term}); {source} "
                    f"{'nothing' if payload is None else repr(payload)}",
                )


def write_quorum_gap(
    config: QuorumConfig,
    fragments: Sequence[Fragment],
    first_retained: int,
    held: Callable[[str, int], pb.Entry | None],
    excused: Collection[str] = (),
) -> str | None:
    """Returns what breaks property 7 first (an entry of a closed fragment missing on a bookie
    of its write set), None when nothing does. Bookies `excused` lost data in a crash after
    the fragment closed: bringing it back is re-replication's work, not the writer's."""
    for fragment in fragments[:-1]:
        last = fragment.last_entry_id
        if last is None:
            continue
        for entry_id in range(max(first_retained, fragment.first_entry_id), last + 1):
            write_set = config.write_set_bookies(fragment.ensemble, entry_id)
            missing = [b for b in write_set if b not in excused and held(b, entry_id) is None]
            if missing:
                return (
                    f"entry {entry_id} of the closed fragment {fragment.first_entry_id}.."
                    f"{last} is missing on {missing} (write set {list(write_set)})"
                )
    return None
