"""Terms a wiped disk took (docs/design.md §4: "a bookie never answers a term-bearing request with a
term it may have forgotten").

Terms are journaled with fsync, so a crash forgets none; a wiped or replaced disk forgets all of
them. BP-46 phase one fences only the non-sealed streams whose fragments name the bookie, so the
term of a SEALED stream, or of one a recovery replaced the bookie away from, is gone, and a
superseded writer of such a stream could get acknowledgments here. So after a cookie fix that
lost a directory, the bookie keeps, durably, the stream id counter of that moment
(`FORGOTTEN_TERMS_FILE`): a term-bearing request for a stream below it that the bookie holds no
state for (`stream.protocol.must_learn_term`) waits until metadata's term for that stream is read
and recorded (journal, fsync); then the term rule applies as always. Each stream is read once,
also when many requests for it arrive together; a stream the bookie knows never waits.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from stream.bookie.config import BookieConfig
from stream.bookie.storage.fsutil import fsync_dir
from stream.errors import StorageError, StreamError, StreamNotFoundError
from stream.protocol import must_learn_term
from stream.wire import bookie_pb2 as pb

log = structlog.get_logger(__name__)

FORGOTTEN_TERMS_FILE = "FORGOTTEN_TERMS_BELOW"

# Reads metadata's term of a stream; None when the stream was deleted. Raises StreamError when
# metadata cannot tell now.
TermReader = Callable[[int], Awaitable[int | None]]


@dataclass(frozen=True)
class Refusal:
    """Why a term-bearing request is not served: its code and message."""

    code: int
    message: str


def _path(config: BookieConfig) -> Path:
    return config.index_path / FORGOTTEN_TERMS_FILE


def note_forgotten_terms(config: BookieConfig, next_stream_id: int) -> None:
    """Records durably that the terms of every stream below `next_stream_id` (the counter read
    now, after the disk's loss) may be forgotten. Call before the fixed cookie is written: a
    crash before then repeats the fix, and this with it."""
    path = _path(config)
    bound = max(next_stream_id, forgotten_terms_bound(config))
    tmp = path.with_name(path.name + ".tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "w") as f:
        f.write(f"{bound}\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fsync_dir(path.parent)
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


def read_stream_term(session: Any, stream_id: int) -> int | None:
    """Returns metadata's term of `stream_id`, None when it was deleted. Blocking. Synced
    first: a lagging ZooKeeper server could give a term older than one this bookie forgot."""
    from stream.metadata import paths
    from stream.metadata.streams import StreamStore

    session.retry(session.zk.sync, paths.STREAMS)
    try:
        meta, _ = StreamStore(session).get_stream_by_id(stream_id)
    except StreamNotFoundError:
        return None
    return meta.term


class ForgottenTerms:
    """The check in front of the storage's term rule (call on the storage's thread, the event
    loop): `must_learn(stream_id)` is the cheap test, `learn(stream_id)` reads and records."""

    def __init__(self, storage: Any, below: int, read_term: TermReader) -> None:
        self._storage = storage
        self._below = below
        self._read_term = read_term
        self._learning: dict[int, asyncio.Future[Refusal | None]] = {}
        # Deleted streams (ids are never reused): refused without reading metadata again.
        self._deleted: set[int] = set()

    @property
    def below(self) -> int:
        return self._below

    def must_learn(self, stream_id: int) -> bool:
        """Returns whether a term-bearing request for `stream_id` must wait for `learn`."""
        if stream_id >= self._below:  # the usual case, and every stream after a while
            return False
        return must_learn_term(
            stream_id, known=self._storage.knows(stream_id), forgotten_below=self._below
        )

    async def learn(self, stream_id: int) -> Refusal | None:
        """Returns once metadata's term of `stream_id` is recorded durably (None: serve the
        request by the term rule), or why the request must be refused: NO_SUCH_STREAM for a
        deleted stream, TOO_BUSY (try again) when metadata or the journal cannot tell now.
        Requests arriving together share one metadata read."""
        if stream_id in self._deleted:
            return _deleted(stream_id)
        pending = self._learning.get(stream_id)
        if pending is None:
            pending = asyncio.ensure_future(self._learn(stream_id))
            self._learning[stream_id] = pending
            pending.add_done_callback(lambda _: self._learning.pop(stream_id, None))
        # Shielded: one cancelled request must not cancel the read the others wait for.
        return await asyncio.shield(pending)

    async def _learn(self, stream_id: int) -> Refusal | None:
        try:
            term = await self._read_term(stream_id)
        except StreamError as e:
            log.warning("terms.metadata_unavailable", stream_id=stream_id, error=str(e))
            return Refusal(
                pb.TOO_BUSY,
                f"cannot read the term of stream {stream_id} from metadata ({e}); this bookie "
                "lost its disk and may have forgotten it",
            )
        if term is None:
            self._deleted.add(stream_id)
            log.info("terms.stream_deleted", stream_id=stream_id)
            return _deleted(stream_id)
        try:
            await asyncio.wrap_future(self._storage.record_term(stream_id, term))
        except StorageError as e:
            return Refusal(pb.INTERNAL, f"cannot record the term of stream {stream_id}: {e}")
        log.info("terms.learned", stream_id=stream_id, term=term)
        return None


def _deleted(stream_id: int) -> Refusal:
    return Refusal(
        pb.NO_SUCH_STREAM,
        f"stream {stream_id} was deleted (metadata has no such stream); this bookie lost its "
        "disk and cannot tell its term",
    )


__all__ = [
    "FORGOTTEN_TERMS_FILE",
    "ForgottenTerms",
    "Refusal",
    "TermReader",
    "forgotten_terms_bound",
    "note_forgotten_terms",
    "read_next_stream_id",
    "read_stream_term",
]
