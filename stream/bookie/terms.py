"""What a bookie checks against metadata before it serves a request (docs/design.md §4): terms a
wiped disk took, terms metadata never handed out, and trims beyond metadata's first retained entry.

Terms a wiped disk took ("a bookie never answers a term-bearing request with a term it may have
forgotten").
Terms are journaled with fsync, so a crash forgets none; a wiped or replaced disk forgets all of
them. BP-46 phase one fences only the non-sealed streams whose fragments name the bookie, so the
term of a SEALED stream, or of one a recovery replaced the bookie away from, is gone, and a
superseded writer of such a stream could get acknowledgments here. So after a cookie fix that
lost a directory, the bookie keeps, durably, the stream id counter of that moment
(`FORGOTTEN_TERMS_FILE`): a term-bearing request for a stream below it that the bookie holds no
state for (`stream.protocol.must_learn_term`) waits until metadata's term for that stream is read
and recorded (journal, fsync); then the term rule applies as always. Each stream is read once,
also when many requests for it arrive together; a stream the bookie knows never waits.

Terms and trims metadata cannot justify ("bookies refuse what metadata cannot justify"): one
`Fence` with an absurd term would fence a stream for good, and a `Trim` (it carries no term) could
delete entries metadata still promises. The same metadata read serves both checks (`MetadataTerms`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream.bookie.config import BookieConfig
from stream.bookie.storage.fsutil import write_file_durably
from stream.bookie.unsafe import SAFE, UnsafeSkips
from stream.errors import StorageError, StreamError, StreamNotFoundError
from stream.logs import get_logger
from stream.protocol import must_justify_term, must_learn_term, term_justified, trim_refusal
from stream.wire import bookie_pb2 as pb

log = get_logger(__name__)

FORGOTTEN_TERMS_FILE = "FORGOTTEN_TERMS_BELOW"

# Why a request was refused, as logged and counted (`streamkeeper_bookie_refused_total`).
UNJUSTIFIED_TERM = "unjustified_term"
UNJUSTIFIED_TRIM = "unjustified_trim"
OVERWRITE = "overwrite"
STREAM_DELETED = "stream_deleted"
METADATA_UNAVAILABLE = "metadata_unavailable"


@dataclass(frozen=True)
class Refusal:
    """Why a request is not served: its code, message and reason (one of the names above)."""

    code: int
    message: str
    reason: str


def _path(config: BookieConfig) -> Path:
    return config.index_path / FORGOTTEN_TERMS_FILE


def note_forgotten_terms(config: BookieConfig, next_stream_id: int) -> None:
    """Records durably that the terms of every stream below `next_stream_id` (the counter read
    now, after the disk's loss) may be forgotten. Call before the fixed cookie is written: a
    crash before then repeats the fix, and this with it."""
    path = _path(config)
    bound = max(next_stream_id, forgotten_terms_bound(config))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file_durably(path, f"{bound}\n".encode())
    log.warning("terms.forgotten", below_stream_id=bound)


def forgotten_terms_bound(config: BookieConfig) -> int:
    """Returns the stream id below which terms may have been forgotten (0: none). Raises
    `StorageError` for a file that does not hold a number (never guess it away)."""
    try:
        text = _path(config).read_text()
    except FileNotFoundError:
        return 0
    try:
        return max(int(text.strip()), 0)
    except ValueError:
        raise StorageError("malformed forgotten-terms file", path=str(_path(config))) from None


def read_next_stream_id(session: Any) -> int:
    """Returns metadata's stream id counter (1 when no stream was ever created). Blocking."""
    from kazoo.exceptions import NoNodeError

    from stream.errors import MetadataError
    from stream.metadata import paths

    try:
        data, _ = session.retry(session.zk.get, paths.STREAMS_NEXT_ID)
    except NoNodeError:
        return 1
    try:
        return int(data.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise MetadataError("malformed stream id counter", path=paths.STREAMS_NEXT_ID) from exc


@dataclass(frozen=True)
class StreamFacts:
    """What metadata tells a bookie about a stream: its term and its first retained entry."""

    term: int
    first_entry_id: int


def read_stream_facts(session: Any, stream_id: int) -> StreamFacts | None:
    """Returns metadata's term and first retained entry of `stream_id`, None when it was
    deleted (or never created). Blocking. Synced first: a lagging ZooKeeper server could give
    a term older than one this bookie forgot, or than the one a writer just took."""
    from stream.metadata import paths
    from stream.metadata.streams import StreamStore

    session.retry(session.zk.sync, paths.STREAMS)
    try:
        meta, _ = StreamStore(session).get_stream_by_id(stream_id)
    except StreamNotFoundError:
        return None
    return StreamFacts(meta.term, meta.first_entry_id)


# Reads metadata's facts of a stream; None when the stream was deleted. Raises StreamError when
# metadata cannot tell now.
FactsReader = Callable[[int], Awaitable[StreamFacts | None]]


@dataclass(frozen=True)
class Checks:
    """Which refusals are on: all of them but in tests that show an attack succeeding
    (`stream.bookie.unsafe`)."""

    justify_terms: bool = True
    justify_trims: bool = True


class MetadataTerms:
    """The checks in front of the storage's term rule and trims, against metadata (call on
    the storage's thread, the event loop).

    - A term-bearing request for a stream whose term a lost disk may have taken
      (`forgotten_below`, see the module doc) waits until metadata's term is recorded.
    - A term above the bookie's is served only when metadata's term is at least as high:
      a writer raises metadata's term before any bookie sees it, so a higher one was never
      handed out (`stream.protocol.term_justified`). The highest term metadata was seen to
      hold is remembered, so metadata is read once per takeover, not per request.
    - A trim beyond metadata's first retained entry is refused (metadata read on each trim;
      trims are rare).

    `must_check(stream_id, term)` is the cheap test, `check(stream_id, term)` reads metadata;
    requests arriving together share one read."""

    def __init__(
        self,
        storage: Any,
        read_facts: FactsReader,
        *,
        forgotten_below: int = 0,
        checks: Checks = Checks(),
    ) -> None:
        self._storage = storage
        self._below = forgotten_below
        self._read_facts = read_facts
        self._checks = checks
        self._reading: dict[int, asyncio.Future[StreamFacts | Refusal | None]] = {}
        # stream id -> the highest term metadata was seen to hold (it never goes down).
        self._justified: dict[int, int] = {}
        # Deleted streams (ids are never reused): refused without reading metadata again.
        self._deleted: set[int] = set()

    @property
    def below(self) -> int:
        return self._below

    def must_learn(self, stream_id: int) -> bool:
        """Returns whether a term-bearing request for `stream_id` must wait for metadata's term
        to be recorded first (a lost disk may have taken it)."""
        if stream_id >= self._below:  # the usual case, and every stream after a while
            return False
        return must_learn_term(
            stream_id, known=self._storage.knows(stream_id), forgotten_below=self._below
        )

    def must_check(self, stream_id: int, term: int) -> bool:
        """Returns whether a request carrying `term` for `stream_id` must wait for `check`:
        False for a term the bookie holds already (every request but a takeover's first)."""
        if self.must_learn(stream_id):
            return True
        return self._checks.justify_terms and must_justify_term(
            term,
            local_term=self._storage.term(stream_id),
            justified_term=self._justified.get(stream_id, 0),
        )

    async def check(self, stream_id: int, term: int) -> Refusal | None:
        """Returns None once a request carrying `term` may be served by the term rule (a
        forgotten term recorded first), or why it is refused: NO_SUCH_STREAM for a deleted
        stream, TOO_BUSY (try again) when metadata or the journal cannot tell now,
        BAD_REQUEST for a term metadata never handed out (nothing recorded)."""
        if not self.must_check(stream_id, term):
            return None
        if stream_id in self._deleted:
            return _deleted(stream_id)
        facts = await self._facts(stream_id, "term")
        if isinstance(facts, Refusal):
            return facts
        if not self._checks.justify_terms or term_justified(term, facts.term):
            return None
        return Refusal(
            pb.BAD_REQUEST,
            f"metadata's term for stream {stream_id} is {facts.term}: it does not justify "
            f"term {term}",
            UNJUSTIFIED_TERM,
        )

    async def trim_refusal(self, stream_id: int, before_entry_id: int) -> Refusal | None:
        """Returns why a Trim of `stream_id` below `before_entry_id` is refused (beyond
        metadata's first retained entry, or metadata cannot tell now), else None. A deleted
        stream may be trimmed entirely."""
        if not self._checks.justify_trims or stream_id in self._deleted:
            return None
        state = self._storage.stream_state(stream_id)
        if state is None or before_entry_id <= state.first_entry_id:
            return None  # moves nothing here: no metadata read
        facts = await self._facts(stream_id, "first retained entry", deleted_ok=True)
        if isinstance(facts, Refusal):
            return facts
        reason = trim_refusal(before_entry_id, None if facts is None else facts.first_entry_id)
        return None if reason is None else Refusal(pb.BAD_REQUEST, reason, UNJUSTIFIED_TRIM)

    async def _facts(self, stream_id: int, what: str, *, deleted_ok: bool = False) -> Any:
        """Returns metadata's facts of `stream_id` (None for a deleted stream with
        `deleted_ok`), once a forgotten term is recorded durably, or the refusal when metadata
        or the journal cannot tell now or the stream was deleted."""
        pending = self._reading.get(stream_id)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch(stream_id, what))
            self._reading[stream_id] = pending
            pending.add_done_callback(lambda _: self._reading.pop(stream_id, None))
        # Shielded: one cancelled request must not cancel the read the others wait for.
        facts = await asyncio.shield(pending)
        if facts is None and not deleted_ok:
            return _deleted(stream_id)
        return facts

    async def _fetch(self, stream_id: int, what: str) -> StreamFacts | Refusal | None:
        try:
            facts = await self._read_facts(stream_id)
        except StreamError as e:
            log.warning("terms.metadata_unavailable", stream_id=stream_id, error=str(e))
            return Refusal(
                pb.TOO_BUSY,
                f"cannot read the {what} of stream {stream_id} from metadata ({e})",
                METADATA_UNAVAILABLE,
            )
        if facts is None:
            self._deleted.add(stream_id)
            log.info("terms.stream_deleted", stream_id=stream_id)
            return None
        if facts.term > self._justified.get(stream_id, 0):
            self._justified[stream_id] = facts.term
        if self.must_learn(stream_id):
            try:
                await asyncio.wrap_future(self._storage.record_term(stream_id, facts.term))
            except StorageError as e:
                return Refusal(
                    pb.INTERNAL, f"cannot record the term of stream {stream_id}: {e}", "internal"
                )
            log.info("terms.learned", stream_id=stream_id, term=facts.term)
        return facts


def metadata_terms_for(
    storage: Any, read_facts: FactsReader, *, forgotten_below: int, unsafe: UnsafeSkips = SAFE
) -> MetadataTerms:
    """Returns the checks against metadata with the protections `unsafe` leaves on (tests
    only turn any off): learning the terms a lost disk took below `forgotten_below`, and
    refusing terms and trims metadata cannot justify."""
    if forgotten_below and "wiped_term_check" in unsafe:
        log.warning("integrity.wiped_term_check_skipped_unsafe")
        forgotten_below = 0
    checks = Checks(
        justify_terms="metadata_term_check" not in unsafe,
        justify_trims="trim_check" not in unsafe,
    )
    if checks != Checks():
        log.warning("integrity.metadata_checks_skipped_unsafe", checks=checks)
    if forgotten_below:
        log.info("integrity.forgotten_terms", below_stream_id=forgotten_below)
    return MetadataTerms(storage, read_facts, forgotten_below=forgotten_below, checks=checks)


def _deleted(stream_id: int) -> Refusal:
    return Refusal(
        pb.NO_SUCH_STREAM,
        f"stream {stream_id} was deleted (metadata has no such stream)",
        STREAM_DELETED,
    )


__all__ = [
    "FORGOTTEN_TERMS_FILE",
    "METADATA_UNAVAILABLE",
    "OVERWRITE",
    "STREAM_DELETED",
    "UNJUSTIFIED_TERM",
    "UNJUSTIFIED_TRIM",
    "Checks",
    "FactsReader",
    "MetadataTerms",
    "Refusal",
    "StreamFacts",
    "forgotten_terms_bound",
    "metadata_terms_for",
    "note_forgotten_terms",
    "read_next_stream_id",
    "read_stream_facts",
]
