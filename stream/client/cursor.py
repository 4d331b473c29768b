"""Durable cursors (a consumer's position kept in metadata): the asyncio core `AsyncCursor`, the
`AutoCommitter` that `tail(cursor=...)` runs, and the synchronous facade `Cursor`.

A cursor's position is the last entry id its consumer is done with (-1: none; None: never
committed); a consumer resumes at the entry after it. Commits are versioned ZooKeeper writes
(stream/metadata/cursors.py), monotone unless `reset=True`, and never beyond the LAC."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from stream.client.reader import AsyncStreamReader
from stream.client.zk_metadata import ZkMetadata
from stream.errors import EntryNotWrittenError, InvalidArgumentError, StreamError
from stream.logs import get_logger
from stream.metadata.cursors import CursorPosition, validate_cursor_name
from stream.metadata.lag import CursorLag, cursor_lag

log = get_logger(__name__)

T = TypeVar("T")

# What `reset` takes besides an entry id (the entry the consumer reads next).
RESET_TARGETS = ("earliest", "latest")


class AsyncCursor:
    """Cursor `name` of stream `stream`. `await open()` first (resolves the stream)."""

    def __init__(
        self,
        stream: str,
        name: str,
        *,
        metadata: ZkMetadata,
        make_reader: Callable[[], AsyncStreamReader],
    ) -> None:
        self.stream = stream
        self.name = validate_cursor_name(name)
        self._metadata = metadata
        self._make_reader = make_reader
        self._stream_id: int | None = None
        # The highest LAC seen: commits at or below it need no bookie round trip.
        self._lac_seen = -1

    @property
    def stream_id(self) -> int:
        assert self._stream_id is not None, "open() first"
        return self._stream_id

    async def open(self) -> None:
        """Resolves the stream; raises `StreamNotFoundError`."""
        meta, _ = await self._metadata.get_stream(self.stream)
        self._stream_id = meta.id

    async def position(self) -> int | None:
        """Returns the committed position, None when the cursor was never committed."""
        found = await self._metadata.get_cursor(self.stream_id, self.name)
        return None if found is None else found.entry_id

    async def _reader(self) -> AsyncStreamReader:
        reader = self._make_reader()
        await reader.open()
        return reader

    async def _lac(self, reader: AsyncStreamReader) -> int:
        lac = await reader.lac()
        self._lac_seen = max(self._lac_seen, lac)
        return lac

    async def commit(self, entry_id: int, *, reset: bool = False) -> CursorPosition:
        """Commits `entry_id` (the consumer is done with it and everything before) and returns
        the stored position. Raises `CursorRegressionError` below the current position unless
        `reset`, `EntryNotWrittenError` beyond the LAC."""
        if type(entry_id) is not int or entry_id < -1:
            raise InvalidArgumentError(
                "a cursor commits an entry id >= -1", cursor=self.name, entry_id=entry_id
            )
        if entry_id > self._lac_seen:
            lac = await self._lac(await self._reader())
            if entry_id > lac:
                raise EntryNotWrittenError(
                    "a cursor cannot commit beyond the LAC",
                    stream=self.stream,
                    cursor=self.name,
                    entry_id=entry_id,
                    lac=lac,
                )
        return await self._metadata.commit_cursor(self.stream_id, self.name, entry_id, reset=reset)

    async def reset(self, to: str | int) -> int:
        """Moves the cursor, backwards or forwards, so that its consumer reads `to` next:
        "earliest" (the first retained entry), "latest" (the entry after the LAC) or an entry
        id; returns the new position (the entry before)."""
        reader = await self._reader()
        if to == "earliest":
            position = reader.meta.first_entry_id - 1
        elif to == "latest":
            position = await self._lac(reader)
        elif type(to) is int and to >= 0:
            position = to - 1
        else:
            raise InvalidArgumentError(
                "reset takes 'earliest', 'latest' or an entry id >= 0", cursor=self.name, to=to
            )
        await self.commit(position, reset=True)
        return position

    async def reset_time(self, ts_ms: int) -> int:
        """Moves the cursor so that its consumer reads next the first entry stamped at or after
        `ts_ms` (milliseconds since the epoch; `seek_time`); returns the new position."""
        reader = await self._reader()
        position = await reader.seek_time(ts_ms) - 1
        await self.commit(position, reset=True)
        return position

    async def lag(self) -> CursorLag:
        """Returns how far the cursor is behind the LAC (see `cursor_lag` for the bytes)."""
        reader = await self._reader()
        position = await self.position()
        lac = await self._lac(reader)
        return cursor_lag(position, lac, reader.meta.first_entry_id, reader.fragments)

    async def delete(self) -> None:
        """Deletes the cursor; raises `CursorNotFoundError` when absent."""
        await self._metadata.delete_cursor(self.stream_id, self.name)


async def cursor_lags(
    metadata: ZkMetadata, reader: AsyncStreamReader, lac: int
) -> dict[str, CursorLag]:
    """Returns the lag of every cursor of the reader's stream (opened: its fragments are the
    snapshot the bytes are counted from) behind `lac`, by cursor name."""
    meta = reader.meta
    return {
        name: cursor_lag(
            position.entry_id, lac, meta.first_entry_id, reader.fragments, position.committed_ms
        )
        for name, position in (await metadata.list_cursors(meta.id)).items()
    }


def check_interval(interval_s: object) -> float:
    """Returns `interval_s` (an auto-commit interval) when it is a number > 0; else raises
    `InvalidArgumentError`."""
    if isinstance(interval_s, bool) or not (isinstance(interval_s, int | float) and interval_s > 0):
        raise InvalidArgumentError(
            "auto_commit_interval_s must be > 0", auto_commit_interval_s=interval_s
        )
    return float(interval_s)


class AutoCommitter:
    """Commits the last entry the application is done with (`done`, set from any thread) at
    most once per `interval_s`, on the client's loop, and once more on `flush()`. A failed
    commit is kept in `error` for the application's next read to raise."""

    def __init__(self, cursor: AsyncCursor, interval_s: float, committed: int | None) -> None:
        self._cursor = cursor
        self.interval_s = check_interval(interval_s)
        self.committed = committed
        self.done: int | None = None
        self.error: StreamError | None = None

    async def run(self) -> None:
        """Commits every `interval_s` until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            await self.flush()

    async def flush(self) -> None:
        """Commits `done` when it moved past what was committed."""
        done = self.done
        if done is None or (self.committed is not None and done <= self.committed):
            return
        try:
            await self._cursor.commit(done)
        except StreamError as e:
            log.warning(
                "cursor.auto_commit_failed",
                stream=self._cursor.stream,
                cursor=self._cursor.name,
                error=str(e),
            )
            self.error = e
            return
        self.committed = done


class Cursor:
    """A durable cursor (synchronous facade): `position`, `commit`, `reset`, `lag`, `delete`.
    `StreamReader.tail(cursor=...)` resumes from it and commits as the application goes."""

    def __init__(self, run: Callable[[Coroutine[Any, Any, Any]], Any], core: AsyncCursor) -> None:
        self._run = run
        self.core = core

    @property
    def stream(self) -> str:
        return self.core.stream

    @property
    def name(self) -> str:
        return self.core.name

    @property
    def position(self) -> int | None:
        """Returns the committed entry id (the last one its consumer is done with; -1 for
        none), None when the cursor was never committed."""
        result: int | None = self._run(self.core.position())
        return result

    def commit(self, entry_id: int, *, reset: bool = False) -> None:
        """Commits `entry_id` (a ZooKeeper CAS). Below the position: `CursorRegressionError`
        unless `reset`; beyond the LAC: `EntryNotWrittenError`."""
        self._run(self.core.commit(entry_id, reset=reset))

    def reset(self, to: str | int) -> int:
        """Makes the consumer read `to` next ("earliest", "latest" or an entry id); returns the
        new position."""
        result: int = self._run(self.core.reset(to))
        return result

    def reset_time(self, ts_ms: int) -> int:
        """Makes the consumer read next the first entry stamped at or after `ts_ms`
        (milliseconds since the epoch); returns the new position."""
        result: int = self._run(self.core.reset_time(ts_ms))
        return result

    @property
    def lag(self) -> CursorLag:
        """Returns the entries and bytes between the position and the LAC."""
        result: CursorLag = self._run(self.core.lag())
        return result

    def delete(self) -> None:
        """Deletes the cursor (`CursorNotFoundError` when absent)."""
        self._run(self.core.delete())
