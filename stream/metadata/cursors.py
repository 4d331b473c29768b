"""Durable cursors in ZooKeeper: one znode per consumer position, `/streams/<id>/cursors/<name>`,
holding the last entry id the consumer is done with and when that was committed.

Cursors sit outside the stream's term-atomic invariant (stream/metadata/streams.py): a commit
never rewrites `meta`, so consumers never make a writer's CAS fail. They go with the stream:
`StreamStore.delete_stream` deletes them. Bounded: at most `MAX_CURSORS_PER_STREAM` per
stream (checked when one is created), names of at most `MAX_CURSOR_NAME_CHARS`, and a value of
a few dozen bytes; the write rate is the client's (auto-commit writes at most once per
interval)."""

from __future__ import annotations

import builtins
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import BadVersionError as KazooBadVersionError
from kazoo.exceptions import NodeExistsError, NoNodeError

from stream.errors import (
    CursorNotFoundError,
    CursorRegressionError,
    InvalidArgumentError,
    MetadataError,
    StreamNotFoundError,
)
from stream.logs import get_logger
from stream.metadata import paths
from stream.metadata.connection import MetadataSession
from stream.metadata.model import validate_stream_id
from stream.metadata.multiop import first_error

log = get_logger(__name__)

MAX_CURSORS_PER_STREAM = 64
MAX_CURSOR_NAME_CHARS = 128
_CURSOR_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_CAS_ATTEMPTS = 16


def validate_cursor_name(name: object) -> str:
    """Returns `name` when it is 1-128 chars of [A-Za-z0-9._-] and not "." or ".."; else raises
    `InvalidArgumentError` (it becomes a znode name)."""
    if not isinstance(name, str) or not _CURSOR_NAME.match(name) or name in (".", ".."):
        raise InvalidArgumentError(
            f"cursor name must be 1-{MAX_CURSOR_NAME_CHARS} chars of [A-Za-z0-9._-], "
            "not '.' or '..'",
            cursor=name,
        )
    return name


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class CursorPosition:
    """A cursor znode's value: `entry_id` is the last entry the consumer is done with (-1:
    none yet, resume at entry 0), `committed_ms` the wall-clock time of the commit."""

    entry_id: int
    committed_ms: int

    def __post_init__(self) -> None:
        if not _is_int(self.entry_id) or self.entry_id < -1:
            raise InvalidArgumentError("cursor entry_id must be an int >= -1", value=self.entry_id)
        if not _is_int(self.committed_ms) or self.committed_ms < 0:
            raise InvalidArgumentError("committed_ms must be an int >= 0", value=self.committed_ms)

    def to_json(self) -> builtins.bytes:
        """Returns the znode's JSON."""
        body = {"entry_id": self.entry_id, "committed_ms": self.committed_ms}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: builtins.bytes) -> CursorPosition:
        """Returns the position in `data`; raises `MetadataError` when malformed."""
        try:
            body = json.loads(data)
            return cls(entry_id=body["entry_id"], committed_ms=body["committed_ms"])
        except (UnicodeDecodeError, ValueError, TypeError, KeyError) as exc:
            raise MetadataError("malformed cursor", reason=str(exc)) from exc


class CursorStore:
    """The cursors of every stream on one metadata session. Blocking (kazoo); thread-safe."""

    def __init__(
        self, session: MetadataSession, *, clock_ms: Callable[[], int] | None = None
    ) -> None:
        self._session = session
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)

    @property
    def _zk(self) -> Any:
        return self._session.zk

    def get(self, stream_id: int, name: str) -> tuple[CursorPosition, int] | None:
        """Returns the cursor's position and znode version, None when it does not exist."""
        validate_stream_id(stream_id)
        path = paths.stream_cursor(stream_id, validate_cursor_name(name))
        try:
            data, stat = self._session.retry(self._zk.get, path)
        except NoNodeError:
            return None
        return self._parse(data, path), stat.version

    @staticmethod
    def _parse(data: bytes, path: str) -> CursorPosition:
        try:
            return CursorPosition.from_json(data)
        except MetadataError as exc:
            raise MetadataError(exc.message, path=path, **exc.context) from exc

    def names(self, stream_id: int) -> list[str]:
        """Returns the names of the stream's cursors, sorted."""
        validate_stream_id(stream_id)
        try:
            names = self._session.retry(self._zk.get_children, paths.stream_cursors(stream_id))
            return sorted(names)
        except NoNodeError:
            return []

    def list(self, stream_id: int) -> dict[str, CursorPosition]:
        """Returns every cursor of the stream by name (one pipelined round trip)."""
        validate_stream_id(stream_id)
        parent = paths.stream_cursors(stream_id)

        def read_once() -> list[tuple[str, bytes]]:
            try:
                names = self._zk.get_children(parent)
            except NoNodeError:
                return []
            pending = [(n, self._zk.get_async(f"{parent}/{n}")) for n in sorted(names)]
            found = []
            for name, result in pending:
                try:
                    found.append((name, result.get()[0]))
                except NoNodeError:
                    continue  # deleted meanwhile
            return found

        raw = self._session.retry(read_once)
        return {name: self._parse(data, f"{parent}/{name}") for name, data in raw}

    def commit(
        self, stream_id: int, name: str, entry_id: int, *, reset: bool = False
    ) -> CursorPosition:
        """Returns the cursor's new position after moving it to `entry_id` (>= -1) with a
        versioned set (the cursor is created when absent, within `MAX_CURSORS_PER_STREAM`). A
        commit below the current position raises `CursorRegressionError` unless `reset`; one
        equal to it writes nothing. Raises `StreamNotFoundError` when the stream is gone."""
        validate_stream_id(stream_id)
        validate_cursor_name(name)
        if not _is_int(entry_id) or entry_id < -1:
            raise InvalidArgumentError(
                "a cursor commits an entry id >= -1", cursor=name, entry_id=entry_id
            )
        for _ in range(_CAS_ATTEMPTS):
            current = self.get(stream_id, name)
            if current is None:
                created = self._create(stream_id, name, entry_id)
                if created is not None:
                    return created
                continue
            position, version = current
            if entry_id < position.entry_id and not reset:
                raise CursorRegressionError(
                    "commit below the cursor's position refused (reset=True moves it back)",
                    stream_id=stream_id,
                    cursor=name,
                    entry_id=entry_id,
                    position=position.entry_id,
                )
            if entry_id == position.entry_id and not reset:
                return position
            wanted = CursorPosition(entry_id, self._clock_ms())
            try:
                self._session.retry(
                    self._zk.set, paths.stream_cursor(stream_id, name), wanted.to_json(), version
                )
            except (KazooBadVersionError, NoNodeError):
                continue  # another commit or a delete came first: look again
            return wanted
        raise MetadataError("cursor commit kept conflicting", stream_id=stream_id, cursor=name)

    def _create(self, stream_id: int, name: str, entry_id: int) -> CursorPosition | None:
        """Returns the position of the cursor it created; None when one appeared meanwhile.
        The multi-op checks that the stream's meta exists, so a cursor never outlives (or
        recreates the directory of) a deleted stream."""
        parent = paths.stream_cursors(stream_id)
        try:
            existing = self._session.retry(self._zk.get_children, parent)
        except NoNodeError:
            existing = None
        if existing is not None and len(existing) >= MAX_CURSORS_PER_STREAM:
            raise InvalidArgumentError(
                f"a stream has at most {MAX_CURSORS_PER_STREAM} cursors; delete one first",
                stream_id=stream_id,
                cursor=name,
            )
        wanted = CursorPosition(entry_id, self._clock_ms())

        def commit_once() -> list[Any]:
            # A fresh transaction per attempt: kazoo commits a transaction object only once.
            txn = self._zk.transaction()
            txn.check(paths.stream_meta(stream_id), -1)
            if existing is None:
                txn.create(parent)
            txn.create(paths.stream_cursor(stream_id, name), wanted.to_json())
            return list(txn.commit())

        results = self._session.retry(commit_once)
        failure = first_error(results)
        if failure is None:
            log.info("metadata.cursor_created", stream_id=stream_id, cursor=name)
            return wanted
        error = failure[1]
        if isinstance(error, NoNodeError):
            raise StreamNotFoundError("stream not found", stream_id=stream_id)
        if isinstance(error, NodeExistsError):
            return None  # the parent or the cursor appeared meanwhile (or our lost reply)
        raise MetadataError(
            "cursor create failed",
            stream_id=stream_id,
            cursor=name,
            error=type(error).__name__,
        )

    def delete(self, stream_id: int, name: str) -> None:
        """Deletes the cursor; raises `CursorNotFoundError` when it does not exist."""
        validate_stream_id(stream_id)
        path = paths.stream_cursor(stream_id, validate_cursor_name(name))
        try:
            self._session.retry(self._zk.delete, path)
        except NoNodeError:
            raise CursorNotFoundError("no such cursor", stream_id=stream_id, cursor=name) from None
        log.info("metadata.cursor_deleted", stream_id=stream_id, cursor=name)
