"""Auto-recovery's state in ZooKeeper (docs/design.md §3, §7): under-replication markers, the
replication workers' locks on them, and the bookies being drained.

- `/underreplicated/fragments/<stream id>-<first entry id>`: persistent, one per fragment that
  names a lost (or draining, or scrubbed-short) bookie: which bookies to replace, why, when.
- `/underreplicated/locks/<same name>`: ephemeral, held by the worker copying that fragment
  (with its progress), so that two workers never copy one marker at once and a dead worker's
  lock goes with its session.
- `/bookies/draining/<bookie id>`: persistent; the bookie turns read-only (writers move off)
  and the auditor marks every fragment naming it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch

from stream.errors import InvalidArgumentError, MetadataError
from stream.logs import get_logger
from stream.metadata import paths
from stream.metadata.connection import MetadataSession
from stream.metadata.model import validate_bookie_id, validate_stream_id
from stream.metadata.streams import WatchHandle

log = get_logger(__name__)

REASONS = ("lost", "draining", "scrub")


@dataclass(frozen=True)
class Marker:
    """One under-replicated fragment: `bookies` of its ensemble must be replaced."""

    stream_id: int
    first_entry_id: int
    bookies: tuple[str, ...]
    reason: str
    marked_ms: int = 0

    def __post_init__(self) -> None:
        validate_stream_id(self.stream_id)
        if type(self.first_entry_id) is not int or self.first_entry_id < 0:
            raise InvalidArgumentError("first_entry_id must be an int >= 0")
        if not self.bookies:
            raise InvalidArgumentError("a marker names at least one bookie")
        for bookie_id in self.bookies:
            validate_bookie_id(bookie_id)
        if self.reason not in REASONS:
            raise InvalidArgumentError("unknown marker reason", reason=self.reason)

    @property
    def name(self) -> str:
        return paths.marker_name(self.stream_id, self.first_entry_id)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "stream_id": self.stream_id,
                "first_entry_id": self.first_entry_id,
                "bookies": list(self.bookies),
                "reason": self.reason,
                "marked_ms": self.marked_ms,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Marker:
        try:
            body = json.loads(data)
            return cls(
                stream_id=body["stream_id"],
                first_entry_id=body["first_entry_id"],
                bookies=tuple(body["bookies"]),
                reason=body["reason"],
                marked_ms=body.get("marked_ms", 0),
            )
        except (ValueError, KeyError, TypeError, InvalidArgumentError) as e:
            raise MetadataError("malformed under-replication marker", reason=str(e)) from e


@dataclass(frozen=True)
class LockInfo:
    """Who holds a marker's lock, and how far its copy got."""

    owner: str
    copied_entries: int = 0
    copied_bytes: int = 0
    target: str = ""

    def to_json(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LockInfo:
        try:
            body = json.loads(data)
            return cls(
                owner=str(body["owner"]),
                copied_entries=int(body.get("copied_entries", 0)),
                copied_bytes=int(body.get("copied_bytes", 0)),
                target=str(body.get("target", "")),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise MetadataError("malformed marker lock", reason=str(e)) from e


class UnderreplicationStore:
    """Markers, locks and draining flags on one metadata session (thread-safe: kazoo calls)."""

    def __init__(self, session: MetadataSession) -> None:
        self._session = session

    @property
    def _zk(self) -> Any:
        return self._session.zk

    def _retry(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._session.retry(fn, *args, **kwargs)

    # -- markers ---------------------------------------------------------------------------

    def mark(self, marker: Marker) -> bool:
        """Records `marker`; an existing marker of the fragment gains its bookies. Returns
        whether anything changed."""
        path = paths.underreplicated_marker(marker.name)
        for _ in range(8):
            try:
                data, stat = self._retry(self._zk.get, path)
            except NoNodeError:
                try:
                    self._retry(self._zk.create, path, marker.to_json())
                except NodeExistsError:
                    continue
                log.info(
                    "autorecovery.marked",
                    stream_id=marker.stream_id,
                    first_entry_id=marker.first_entry_id,
                    bookies=list(marker.bookies),
                    reason=marker.reason,
                )
                return True
            try:
                existing = Marker.from_json(data)
            except MetadataError:
                existing = None
            if existing is not None and set(marker.bookies) <= set(existing.bookies):
                return False
            bookies = tuple(
                dict.fromkeys((*(existing.bookies if existing else ()), *marker.bookies))
            )
            merged = Marker(
                marker.stream_id, marker.first_entry_id, bookies, marker.reason, marker.marked_ms
            )
            try:
                self._retry(self._zk.set, path, merged.to_json(), version=stat.version)
                return True
            except (BadVersionError, NoNodeError):  # changed or worked meanwhile: again
                continue
        raise MetadataError("could not record the marker", marker=marker.name)

    def markers(self) -> list[Marker]:
        """Returns every marker, in name order (malformed ones are logged and skipped)."""
        found = []
        for name in sorted(self._retry(self._zk.get_children, paths.UNDERREPLICATED_FRAGMENTS)):
            marker = self.marker(name)
            if marker is not None:
                found.append(marker)
        return found

    def marker(self, name: str) -> Marker | None:
        """Returns marker `name`, None when it is gone (or malformed)."""
        found = self.marker_with_version(name)
        return None if found is None else found[0]

    def marker_with_version(self, name: str) -> tuple[Marker, int] | None:
        """Returns marker `name` and its znode version, None when it is gone (or malformed)."""
        try:
            data, stat = self._retry(self._zk.get, paths.underreplicated_marker(name))
        except NoNodeError:
            return None
        try:
            return Marker.from_json(data), stat.version
        except MetadataError as e:
            log.warning("autorecovery.marker_malformed", name=name, error=str(e))
            return None

    def unmark(self, name: str, version: int = -1) -> bool:
        """Removes marker `name` (the fragment is whole again, or gone) if it is still at
        `version` (-1: any); returns False when it changed meanwhile (it gained bookies)."""
        try:
            self._retry(self._zk.delete, paths.underreplicated_marker(name), version=version)
        except NoNodeError:
            pass
        except BadVersionError:
            return False
        log.info("autorecovery.unmarked", name=name)
        return True

    def watch_markers(self, callback: Callable[[list[str]], None]) -> WatchHandle:
        """Calls `callback(names)` on a kazoo thread now and whenever markers come or go,
        until the returned handle is stopped."""
        return self._watch_children(paths.UNDERREPLICATED_FRAGMENTS, callback)

    def watch_draining(self, callback: Callable[[list[str]], None]) -> WatchHandle:
        """Calls `callback(bookie ids)` now and whenever the draining set changes."""
        return self._watch_children(paths.BOOKIES_DRAINING, callback)

    def _watch_children(self, path: str, callback: Callable[[list[str]], None]) -> WatchHandle:
        handle = WatchHandle()

        def on_children(children: list[str]) -> bool | None:
            if handle.stopped:
                return False
            try:
                callback(children)
            except Exception:
                log.exception("autorecovery.watch_failed", path=path)
            return None

        ChildrenWatch(self._zk, path, on_children)
        return handle

    # -- locks -----------------------------------------------------------------------------

    def try_lock(self, name: str, info: LockInfo) -> bool:
        """Returns whether this session now holds marker `name`'s lock (an ephemeral znode);
        False when another worker holds it."""
        try:
            self._retry(
                self._zk.create, paths.underreplicated_lock(name), info.to_json(), ephemeral=True
            )
        except NodeExistsError:
            return False
        return True

    def update_lock(self, name: str, info: LockInfo) -> None:
        """Records progress in the lock we hold (best effort)."""
        try:
            self._retry(self._zk.set, paths.underreplicated_lock(name), info.to_json())
        except NoNodeError:
            pass

    def unlock(self, name: str) -> None:
        """Releases marker `name`'s lock (another worker may take it at once)."""
        try:
            self._retry(self._zk.delete, paths.underreplicated_lock(name))
        except NoNodeError:
            pass

    def lock_info(self, name: str) -> LockInfo | None:
        """Returns who holds marker `name`'s lock, None when nobody does."""
        try:
            data, _ = self._retry(self._zk.get, paths.underreplicated_lock(name))
        except NoNodeError:
            return None
        try:
            return LockInfo.from_json(data)
        except MetadataError:
            return LockInfo(owner="?")

    # -- draining --------------------------------------------------------------------------

    def set_draining(self, bookie_id: str, draining: bool) -> None:
        """Marks `bookie_id` as being drained (or no longer)."""
        validate_bookie_id(bookie_id)
        path = paths.bookie_draining(bookie_id)
        if draining:
            body = json.dumps({"since_ms": time.time_ns() // 1_000_000}).encode()
            try:
                self._retry(self._zk.create, path, body)
            except NodeExistsError:
                pass
        else:
            try:
                self._retry(self._zk.delete, path)
            except NoNodeError:
                pass

    def draining(self) -> set[str]:
        """Returns the bookies being drained."""
        return set(self._retry(self._zk.get_children, paths.BOOKIES_DRAINING))
