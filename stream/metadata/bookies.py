"""The bookie registry: ephemeral registrations under `/bookies/available` (kept across
ZooKeeper session expiry), their watch, and the cookies under `/bookies/cookies`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import BadVersionError as KazooBadVersionError
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from stream.errors import BadVersionError, MetadataError
from stream.logs import get_logger
from stream.metadata import paths
from stream.metadata.connection import MetadataSession, SessionState
from stream.metadata.model import validate_bookie_id
from stream.metadata.streams import WatchHandle
from stream.protocol.placement import DEFAULT_MAX_ENTRY_BYTES

log = get_logger(__name__)

# Bound on the reread-and-retry loops against a concurrent writer of the same znode.
_ATTEMPTS = 8


@dataclass(frozen=True)
class BookieRegistration:
    """What a bookie publishes in `/bookies/available/<bookie_id>`."""

    address: str  # "host:port" of its gRPC service
    read_only: bool = False
    free_bytes: int = 0
    # Whether entries go through its journal (`journal_write_data`); placement keeps AQ = 1
    # streams off bookies without it. Registrations older than the field read as True (the
    # default setting).
    journal_write_data: bool = True
    # The largest payload it accepts (`max_entry_bytes`), so that writers refuse a larger one
    # before sending it. Registrations older than the field read as the default setting.
    max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES
    # "host:port" of its data port (Add streams framed over TCP, `stream.wire.frames`); ""
    # when it has none (turned off, or a registration older than the field): writers add over
    # gRPC.
    data_address: str = ""

    def to_json(self) -> bytes:
        """Returns the registration znode's JSON (sorted keys: equal values, equal bytes)."""
        body = {
            "address": self.address,
            "read_only": self.read_only,
            "free_bytes": self.free_bytes,
            "journal_write_data": self.journal_write_data,
            "max_entry_bytes": self.max_entry_bytes,
            "data_address": self.data_address,
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> BookieRegistration:
        """Returns the registration in `data`; raises `MetadataError` when malformed."""
        try:
            body = json.loads(data)
            address, read_only = body["address"], body.get("read_only", False)
            free_bytes = body.get("free_bytes", 0)
            journal = body.get("journal_write_data", True)
            max_entry = body.get("max_entry_bytes", DEFAULT_MAX_ENTRY_BYTES)
            data_address = body.get("data_address", "")
        except (UnicodeDecodeError, ValueError, TypeError, KeyError) as exc:
            raise MetadataError("malformed bookie registration") from exc
        if (
            not isinstance(address, str)
            or not isinstance(read_only, bool)
            or not isinstance(free_bytes, int)
            or isinstance(free_bytes, bool)
            or not isinstance(journal, bool)
            or not isinstance(max_entry, int)
            or isinstance(max_entry, bool)
            or not isinstance(data_address, str)
        ):
            raise MetadataError("malformed bookie registration", address=address)
        return cls(
            address=address,
            read_only=read_only,
            free_bytes=free_bytes,
            journal_write_data=journal,
            max_entry_bytes=max_entry,
            data_address=data_address,
        )


class BookieRegistry:
    """Registers bookies and reads who is available. A registration made here is restored
    after the ZooKeeper session expires and a new one is made, because the bookie keeps
    serving across a session loss."""

    def __init__(self, session: MetadataSession) -> None:
        """Follows `session`'s state to re-register after a session expiry."""
        self._session = session
        self._lock = threading.RLock()
        self._registered: dict[str, BookieRegistration] = {}
        session.add_session_listener(self._on_session_state)

    @property
    def _zk(self) -> Any:
        return self._session.zk

    # ---------------------------------------------------------------- registration

    def register(self, bookie_id: str, reg: BookieRegistration) -> None:
        """Publishes `reg` in the ephemeral `/bookies/available/<bookie_id>`. When the znode
        exists and is this session's, updates it; when another live session holds it (often a
        restarted bookie's previous session, not yet timed out), waits up to the session
        timeout for it to go, then raises `MetadataError("bookie already registered")`."""
        validate_bookie_id(bookie_id)
        path = paths.bookie_available(bookie_id)
        deadline = time.monotonic() + self._session.session_timeout_s
        while True:
            with self._lock:
                owner = self._create_or_update_own(path, reg)
                if owner is None:
                    self._registered[bookie_id] = reg
                    log.info("metadata.bookie_registered", bookie=bookie_id, address=reg.address)
                    return
            log.info("metadata.bookie_waiting_for_old_session", bookie=bookie_id)
            if not self._wait_gone(path, deadline):
                raise MetadataError(
                    "bookie already registered", bookie=bookie_id, owner_session=f"0x{owner:x}"
                )

    def _create_or_update_own(self, path: str, reg: BookieRegistration) -> int | None:
        """Returns None once `path` holds `reg` and belongs to this session, or the session id
        of another owner."""
        data = reg.to_json()
        for _ in range(_ATTEMPTS):
            try:
                self._session.retry(self._zk.create, path, data, ephemeral=True)
                return None
            except NodeExistsError:
                pass
            try:
                current, stat = self._session.retry(self._zk.get, path)
            except NoNodeError:
                continue
            if stat.ephemeralOwner != self._session.session_id:
                return int(stat.ephemeralOwner)
            # Ours (maybe our own create whose reply was lost): update in place.
            if current == data:
                return None
            try:
                self._session.retry(self._zk.set, path, data, stat.version)
                return None
            except (NoNodeError, KazooBadVersionError):
                continue
        raise MetadataError("bookie registration kept conflicting", path=path)

    def _wait_gone(self, path: str, deadline: float) -> bool:
        """Returns True once `path` no longer exists, False if it still does at `deadline`."""
        while True:
            fired = threading.Event()
            watch = _setter(fired)
            if self._session.retry(self._zk.exists, path, watch=watch) is None:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            # The watch also fires on a data change or a connection event: look again then.
            fired.wait(remaining)

    def update(self, bookie_id: str, reg: BookieRegistration) -> None:
        """Replaces this session's registration of `bookie_id` with `reg` (e.g. read-only or
        free space changed); raises `MetadataError` when this registry did not register it."""
        validate_bookie_id(bookie_id)
        with self._lock:
            if bookie_id not in self._registered:
                raise MetadataError("bookie not registered here", bookie=bookie_id)
            self._registered[bookie_id] = reg
            owner = self._create_or_update_own(paths.bookie_available(bookie_id), reg)
            if owner is not None:
                raise MetadataError(
                    "bookie registered by another session",
                    bookie=bookie_id,
                    owner_session=f"0x{owner:x}",
                )

    def unregister(self, bookie_id: str) -> None:
        """Removes this session's registration of `bookie_id` (and stops restoring it); a
        registration owned by another session stays."""
        validate_bookie_id(bookie_id)
        path = paths.bookie_available(bookie_id)
        with self._lock:
            self._registered.pop(bookie_id, None)
            try:
                _, stat = self._session.retry(self._zk.get, path)
                if stat.ephemeralOwner == self._session.session_id:
                    self._session.retry(self._zk.delete, path, stat.version)
                    log.info("metadata.bookie_unregistered", bookie=bookie_id)
            except (NoNodeError, KazooBadVersionError):
                pass

    def _on_session_state(self, state: SessionState) -> None:
        """Restores every registration after a (re)connection: a new session has none of the
        old session's ephemeral znodes. Runs on the session's notifier thread."""
        if state is not SessionState.CONNECTED:
            return
        with self._lock:
            registered = dict(self._registered)
            for bookie_id, reg in registered.items():
                try:
                    owner = self._create_or_update_own(paths.bookie_available(bookie_id), reg)
                except MetadataError:
                    # The connection dropped again; the next CONNECTED retries.
                    log.warning(
                        "metadata.bookie_reregister_failed", bookie=bookie_id, exc_info=True
                    )
                    continue
                if owner is None:
                    log.info("metadata.bookie_reregistered", bookie=bookie_id)
                else:
                    log.error(
                        "metadata.bookie_taken_over",
                        bookie=bookie_id,
                        owner_session=f"0x{owner:x}",
                    )

    # ---------------------------------------------------------------- reads and watch

    def available(self) -> dict[str, BookieRegistration]:
        """Returns the registered bookies by id (malformed registrations are skipped)."""
        parent = paths.BOOKIES_AVAILABLE

        def read_once() -> list[tuple[str, bytes]]:
            children = self._zk.get_children(parent)
            pending = [(c, self._zk.get_async(f"{parent}/{c}")) for c in children]
            found = []
            for child, result in pending:
                try:
                    found.append((child, result.get()[0]))
                except NoNodeError:
                    continue  # went away meanwhile
            return found

        registrations = {}
        for bookie_id, data in self._session.retry(read_once):
            try:
                registrations[bookie_id] = BookieRegistration.from_json(data)
            except MetadataError:
                log.warning("metadata.bookie_registration_malformed", bookie=bookie_id)
        return registrations

    def watch_available(
        self, callback: Callable[[dict[str, BookieRegistration]], None]
    ) -> WatchHandle:
        """Calls `callback(available bookies)` now and after every change: a bookie coming,
        going, or updating its registration. Calls run on kazoo's event thread, one at a time,
        and only when the set actually changed; the watch survives session expiry."""
        return _AvailableWatch(self._session, callback).handle

    # ---------------------------------------------------------------- cookies

    def with_cookie(self) -> list[str]:
        """Returns the ids of every bookie that ever joined (each holds a cookie), sorted:
        the available ones and those that are down."""
        return sorted(self._session.retry(self._zk.get_children, paths.BOOKIES_COOKIES))

    def read_cookie(self, bookie_id: str) -> tuple[bytes, int] | None:
        """Returns `(cookie data, znode version)`, None when the bookie has no cookie."""
        validate_bookie_id(bookie_id)
        try:
            data, stat = self._session.retry(self._zk.get, paths.bookie_cookie(bookie_id))
        except NoNodeError:
            return None
        return bytes(data), stat.version

    def write_cookie(self, bookie_id: str, data: bytes, version: int | None) -> int:
        """Returns the cookie znode's new version after creating it (`version` None) or
        replacing it at `version`. Idempotent under lost replies: a create that finds the same
        data, or a replace that finds the same data one version on, counts as done. Raises
        `MetadataError` when another cookie exists, `BadVersionError` on a version conflict."""
        validate_bookie_id(bookie_id)
        path = paths.bookie_cookie(bookie_id)
        if version is None:
            try:
                self._session.retry(self._zk.create, path, data)
                return 0
            except NodeExistsError:
                current = self.read_cookie(bookie_id)
                if current is not None and current[0] == data:
                    return current[1]
                raise MetadataError("bookie already has another cookie", bookie=bookie_id) from None
        try:
            return int(self._session.retry(self._zk.set, path, data, version).version)
        except KazooBadVersionError:
            current = self.read_cookie(bookie_id)
            if current is not None and current == (data, version + 1):
                return version + 1  # our own write whose reply was lost
            raise BadVersionError(
                "cookie changed",
                bookie=bookie_id,
                expected_version=version,
                current_version=None if current is None else current[1],
            ) from None
        except NoNodeError:
            raise MetadataError("bookie has no cookie to replace", bookie=bookie_id) from None

    def delete_cookie(self, bookie_id: str, version: int) -> None:
        """Deletes the cookie at `version`; a missing cookie counts as deleted. Raises
        `BadVersionError` when it changed meanwhile."""
        validate_bookie_id(bookie_id)
        try:
            self._session.retry(self._zk.delete, paths.bookie_cookie(bookie_id), version)
        except NoNodeError:
            pass
        except KazooBadVersionError:
            raise BadVersionError(
                "cookie changed", bookie=bookie_id, expected_version=version
            ) from None


def _setter(event: threading.Event) -> Callable[[Any], None]:
    """Returns a kazoo watch function that sets `event`."""
    return lambda _: event.set()


class _AvailableWatch:
    """Children watch on `/bookies/available` plus one data watch per bookie, folded into
    one snapshot that is delivered whenever it changes."""

    def __init__(
        self, session: MetadataSession, callback: Callable[[dict[str, BookieRegistration]], None]
    ) -> None:
        self.handle = WatchHandle()
        self._zk = session.zk
        self._callback = callback
        self._lock = threading.RLock()
        # One token per live data watch: a watch whose token is no longer here stops itself.
        self._tokens: dict[str, object] = {}
        self._registrations: dict[str, BookieRegistration] = {}
        self._delivered: dict[str, BookieRegistration] | None = None
        self._batching = False
        ChildrenWatch(self._zk, paths.BOOKIES_AVAILABLE, self._on_children)

    def _on_children(self, children: list[str]) -> bool | None:
        if self.handle.stopped:
            return False
        with self._lock:
            # Adding data watches reads each new child at once; deliver one snapshot after.
            self._batching = True
            try:
                for bookie_id in children:
                    if bookie_id not in self._tokens:
                        token = object()
                        self._tokens[bookie_id] = token
                        DataWatch(
                            self._zk,
                            paths.bookie_available(bookie_id),
                            self._data_callback(bookie_id, token),
                        )
                for bookie_id in set(self._tokens) - set(children):
                    del self._tokens[bookie_id]
                    self._registrations.pop(bookie_id, None)
            finally:
                self._batching = False
            self._deliver()
        return None

    def _data_callback(self, bookie_id: str, token: object) -> Callable[..., bool | None]:
        # Takes `event` so that kazoo never retries the call with two arguments.
        def on_data(data: bytes | None, stat: Any, event: Any = None) -> bool | None:
            with self._lock:
                if self.handle.stopped or self._tokens.get(bookie_id) is not token:
                    return False
                if data is None:
                    # Keep watching: the bookie may come back before the children watch runs.
                    self._registrations.pop(bookie_id, None)
                else:
                    try:
                        self._registrations[bookie_id] = BookieRegistration.from_json(data)
                    except MetadataError:
                        log.warning("metadata.bookie_registration_malformed", bookie=bookie_id)
                        self._registrations.pop(bookie_id, None)
                if not self._batching:
                    self._deliver()
            return None

        return on_data

    def _deliver(self) -> None:
        snapshot = dict(self._registrations)
        if snapshot == self._delivered or self.handle.stopped:
            return
        self._delivered = snapshot
        try:
            self._callback(dict(snapshot))
        except Exception:
            log.exception("metadata.watch_callback_failed")
