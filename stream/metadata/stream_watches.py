"""Watches on a stream's meta and fragments, on kazoo's event thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kazoo.recipe.watchers import DataWatch

from stream.errors import (
    MetadataError,
    StreamNotFoundError,
)
from stream.logs import get_logger
from stream.metadata import paths
from stream.metadata.model import (
    Fragment,
    StreamMeta,
    validate_stream_id,
)
from stream.metadata.stream_reads import StreamReads

log = get_logger(__name__)


class WatchHandle:
    """Returned by the watch methods; `stop()` ends the watch at its next event (kazoo offers
    no way to cancel a ZooKeeper watch earlier)."""

    def __init__(self) -> None:
        self._stopped = threading.Event()

    def stop(self) -> None:
        """Stops delivering events."""
        self._stopped.set()

    @property
    def stopped(self) -> bool:
        """Returns whether the watch was stopped (by `stop()`, the callback or a deletion)."""
        return self._stopped.is_set()


def _call_back(callback: Callable[..., object], *args: Any) -> object:
    """Returns what `callback(*args)` returns; logs and swallows its exceptions, which would
    otherwise kill kazoo's watcher."""
    try:
        return callback(*args)
    except Exception:
        log.exception("metadata.watch_callback_failed")
        return None


class StreamWatches(StreamReads):
    """Calls back on every change of a stream."""

    def watch_meta(
        self,
        stream_id: int,
        callback: Callable[[StreamMeta | None, int | None], object],
    ) -> WatchHandle:
        """Calls `callback(meta, version)` now and on every change of the stream's meta (hence
        on every fragment change), and `callback(None, None)` once when the stream is deleted,
        which ends the watch (ids are never reused). The callback runs on kazoo's event thread;
        returning False ends the watch. Raises `StreamNotFoundError` when the stream is
        absent."""
        validate_stream_id(stream_id)
        path = paths.stream_meta(stream_id)
        if self._session.retry(self._zk.exists, path) is None:
            raise StreamNotFoundError("stream not found", stream_id=stream_id)
        handle = WatchHandle()

        # Takes `event` so that kazoo never retries the call with two arguments.
        def on_data(data: bytes | None, stat: Any, event: Any = None) -> bool | None:
            if handle.stopped:
                return False
            if data is None or stat is None:
                handle.stop()
                _call_back(callback, None, None)
                return False
            try:
                meta = StreamMeta.from_json(data)
            except MetadataError:
                log.warning("metadata.meta_malformed", stream_id=stream_id)
                return None
            if _call_back(callback, meta, stat.version) is False:
                handle.stop()
                return False
            return None

        DataWatch(self._zk, path, on_data)
        return handle

    def watch_fragments(
        self, stream_id: int, callback: Callable[[list[Fragment]], object]
    ) -> WatchHandle:
        """Calls `callback(fragments)` (sorted, a consistent snapshot) now and whenever the
        fragments change, and `callback([])` once when the stream is deleted. Built on the meta
        watch, since every fragment change rewrites meta. Returning False ends the watch."""
        delivered: list[list[Fragment] | None] = [None]

        def on_meta(meta: StreamMeta | None, version: int | None) -> bool | None:
            if meta is None:
                _call_back(callback, [])
                return False
            try:
                _, _, fragments = self.get_snapshot(stream_id)
            except StreamNotFoundError:
                return None  # the deletion event follows
            except MetadataError:
                log.warning("metadata.fragments_unreadable", stream_id=stream_id, exc_info=True)
                return None
            if fragments == delivered[0]:
                return None
            delivered[0] = fragments
            return False if _call_back(callback, fragments) is False else None

        return self.watch_meta(stream_id, on_meta)
