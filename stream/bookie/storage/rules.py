"""The term rule every request obeys, and the requests that change a stream's state without
storing entries: fence, truncate, trim, a term learned from metadata, limbo."""

from __future__ import annotations

from concurrent.futures import Future

from stream.bookie.codes import BAD_REQUEST, INTERNAL, NO_SUCH_STREAM, OK, wire_code
from stream.bookie.storage import codec
from stream.bookie.storage.outcomes import FenceResult, TrimOutcome, TruncateOutcome
from stream.bookie.storage.state import LocalStreamState
from stream.bookie.storage.store import Store, failed_future
from stream.bookie.unsafe import UnsafeSkips
from stream.protocol.invariant import invariant
from stream.protocol.terms import TermDecision, term_decision
from stream.protocol.truncation import (
    TruncateDecision,
    stale_truncate_message,
    truncate_decision,
)


def term_message(decision: TermDecision, term: int, local_term: int) -> str:
    """Returns why a request with `term` is not served (`decision` does not serve it)."""
    if decision is TermDecision.REJECT:
        return f"term {term} is below the bookie's term {local_term}"
    return "a term >= 1 is required"


class RequestRules:
    """The term rule, and fence, truncate, trim, record_term and set_limbo over one `Store`.
    `unsafe` turns protections off, in tests only (`stream.bookie.unsafe`)."""

    def __init__(self, store: Store, unsafe: UnsafeSkips) -> None:
        self._store = store
        # Off only in the chaos test that shows its checker catches a superseded writer.
        self._serve_stale_adds = "add_term_check" in unsafe
        # Off only in the simulator's runs that show what a bookie without fencing lets by.
        self._serve_stale_terms = "term_check" in unsafe
        # Off only in tests that show a late Truncate deleting its term's later entries.
        self._order_truncates = "truncate_order" not in unsafe

    def decide(self, local_term: int, term: int, *, add: bool = False) -> TermDecision:
        """The term rule (`stream.protocol.term_decision`), unless a test-only switch serves
        lower terms: every request's ("term_check", no fencing at all) or adds' only."""
        decision = term_decision(local_term, term)
        if decision is TermDecision.REJECT and (
            self._serve_stale_terms or (add and self._serve_stale_adds)
        ):
            return TermDecision.ACCEPT
        return decision

    def fence(self, stream_id: int, term: int) -> FenceResult:
        """Applies the term rule (a new term is recorded durably, creating the stream when
        unknown) and returns what the bookie knows of the stream's end."""
        store = self._store
        unusable = store.usable()
        if unusable is not None:
            return FenceResult(INTERNAL, 0, -1, -1, -1, False, None, unusable)
        if stream_id == 0:
            return FenceResult(BAD_REQUEST, 0, -1, -1, -1, False, None, "stream_id 0")
        state = store.states.get(stream_id)
        local_term = state.term if state is not None else 0
        decision = self.decide(local_term, term)
        code = wire_code(decision.code)
        durable = None
        if decision is TermDecision.ACCEPT_NEW:
            with store.lock:
                state = store.apply_term(stream_id, term)
                durable = store.journal.append(
                    codec.REC_TERM, codec.TERM_BODY.pack(stream_id, term)
                )
                store.term_recorded(stream_id, durable)
        elif decision.serves:
            with store.lock:
                durable = store.unsynced_term(stream_id)
        if state is None:  # rejected (BAD) for a stream never seen
            return FenceResult(code, 0, -1, -1, -1, False, None, "term must be >= 1")
        message = "" if decision.serves else term_message(decision, term, state.term)
        return FenceResult(
            code,
            state.term,
            state.lac,
            state.lafr,
            state.last_entry_id,
            state.limbo,
            durable,
            message,
        )

    def truncate(self, stream_id: int, term: int, after_entry_id: int) -> TruncateOutcome:
        """Deletes every entry of the stream above `after_entry_id` (-1: all), from the
        caches and the index, durably; the term rule applies (an unknown stream is created
        with the term)."""
        store = self._store
        unusable = store.usable()
        if unusable is not None:
            return TruncateOutcome(INTERNAL, 0, None, unusable)
        state = store.states.get(stream_id)
        local_term = state.term if state is not None else 0
        if stream_id == 0 or after_entry_id < -1:
            return TruncateOutcome(BAD_REQUEST, local_term, None, "bad stream or entry id")
        decision = self.decide(local_term, term)
        if not decision.serves:
            message = term_message(decision, term, local_term)
            return TruncateOutcome(wire_code(decision.code), local_term, None, message)
        late = self._late_truncate(stream_id, state, term, after_entry_id)
        if late is not None:
            return late
        with store.lock:
            durable = store.journal.append(
                codec.REC_TRUNCATE, codec.TRUNCATE_BODY.pack(stream_id, term, after_entry_id)
            )
            if term > local_term:
                store.term_recorded(stream_id, durable)
            state = store.apply_truncate(stream_id, term, after_entry_id)
        return TruncateOutcome(OK, state.term, durable)

    def _late_truncate(
        self, stream_id: int, state: LocalStreamState | None, term: int, after_entry_id: int
    ) -> TruncateOutcome | None:
        """The answer to a Truncate that must delete nothing (`truncate_decision`: a repeat
        of, or older than, the one the stream last applied in its term), or None to apply it.
        Off with the test-only "truncate_order" switch."""
        if state is None or not self._order_truncates:
            return None
        decision = truncate_decision(
            state.truncate_term, state.truncate_after, term, after_entry_id
        )
        if decision is TruncateDecision.APPLY:
            return None
        if decision is TruncateDecision.ALREADY_APPLIED:
            with self._store.lock:
                return TruncateOutcome(OK, state.term, self._store.unsynced_term(stream_id))
        message = stale_truncate_message(term, after_entry_id, state.truncate_after)
        return TruncateOutcome(BAD_REQUEST, state.term, None, message)

    def trim(self, stream_id: int, before_entry_id: int) -> TrimOutcome:
        """Drops every entry of the stream below `before_entry_id` (retention): reads below
        answer TRIMMED at once, the index and the entry logs are cleaned by GC. Never moves
        the first retained entry backwards."""
        store = self._store
        unusable = store.usable()
        if unusable is not None:
            return TrimOutcome(INTERNAL, 0, None, unusable)
        if stream_id == 0 or before_entry_id < 0:
            return TrimOutcome(BAD_REQUEST, 0, None, "bad stream or entry id")
        state = store.states.get(stream_id)
        if state is None:
            return TrimOutcome(NO_SUCH_STREAM, 0, None, "unknown stream")
        if before_entry_id <= state.first_entry_id:
            return TrimOutcome(OK, state.first_entry_id, None)
        with store.lock:
            durable = store.journal.append(
                codec.REC_TRIM, codec.TRIM_BODY.pack(stream_id, before_entry_id)
            )
            store.apply_trim(stream_id, before_entry_id)
        return TrimOutcome(OK, state.first_entry_id, durable)

    def record_term(self, stream_id: int, term: int) -> Future[None]:
        """Raises the stream's term to at least `term` (creating its state, even at term 0),
        through the journal; returns the future of the sync. For a term learned from metadata
        (`stream.bookie.terms`): the stream is known from then on."""
        invariant(stream_id != 0 and term >= 0, "record_term needs a stream id and a term")
        store = self._store
        unusable = store.usable()
        if unusable is not None:
            return failed_future(unusable, stream_id=stream_id)
        with store.lock:
            durable = store.journal.append(codec.REC_TERM, codec.TERM_BODY.pack(stream_id, term))
            store.apply_term(stream_id, term)
            store.term_recorded(stream_id, durable)
        return durable

    def set_limbo(self, stream_id: int, limbo: bool, term: int | None = None) -> Future[None]:
        """Sets or clears the stream's limbo status (creating the stream state if missing)
        and raises its term to at least `term`, through the journal; returns the future of
        the sync (BP-46 phase one and two)."""
        invariant(stream_id != 0, "set_limbo needs a stream id")
        store = self._store
        unusable = store.usable()
        if unusable is not None:
            return failed_future(unusable, stream_id=stream_id)
        term_value = max(term or 0, 0)
        with store.lock:
            durable = store.journal.append(
                codec.REC_LIMBO, codec.LIMBO_BODY.pack(stream_id, int(limbo), term_value)
            )
            store.apply_limbo(stream_id, limbo, term_value)
        return durable
