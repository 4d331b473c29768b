"""A simulated ZooKeeper: an in-memory fake of the part of the kazoo client API that
`stream.metadata` uses, so that the REAL `StreamStore` and `BookieRegistry` run in simulation,
plus the client's metadata port on top of them.

- `FakeZooKeeper` is the server: one znode tree, versions, ephemerals owned by sessions,
  sequence nodes, multi-ops, one-shot watches. Errors are kazoo's own exception classes, raised
  (or, in a multi-op, returned per op) exactly where kazoo raises them.
- `FakeKazooClient` is one session's client: `create`, `get`, `get_async`, `set`, `delete`,
  `exists`, `get_children`, `ensure_path`, `transaction()`, `client_id`. After the session is
  expired every call raises `SessionExpiredError` until the client reconnects (a new session,
  as kazoo does) at a virtual time. A fault hook may make a write raise `ConnectionLoss` after
  it was applied (a lost reply).
- `SimMetadataSession` stands in for `stream.metadata.MetadataSession` (`zk`, `retry`, session
  ids, generation, listeners), without threads.
- `SimMetadata` implements the client's `MetadataPort`: each call crosses the simulated network
  to the "zk" node, runs the real `StreamStore` call there at one virtual instant, and crosses
  back.

Nothing here reads real time or global randomness.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from kazoo.exceptions import (
    BadArgumentsError,
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)
from kazoo.protocol.states import EventType, KazooState, WatchedEvent, ZnodeStat

from stream.client.zk_metadata import ZkMetadata
from stream.errors import MetadataError
from stream.logs import get_logger
from stream.metadata.bookies import BookieRegistry
from stream.metadata.connection import (
    MetadataSessionExpiredError,
    SessionListener,
    SessionState,
)
from stream.metadata.cursors import CursorStore
from stream.metadata.streams import StreamStore
from stream.sim.network import ZK_NODE

if TYPE_CHECKING:
    from stream.sim.network import SimNetwork

log = get_logger(__name__)

T = TypeVar("T")

# Bound on the retries of one call after injected connection losses.
_RETRY_ATTEMPTS = 16


@dataclass
class _Znode:
    data: bytes
    czxid: int
    mzxid: int
    ctime_ms: int
    mtime_ms: int
    version: int = 0
    cversion: int = 0
    ephemeral_owner: int = 0
    pzxid: int = 0
    children: set[str] = field(default_factory=set)

    def stat(self) -> ZnodeStat:
        return ZnodeStat(
            self.czxid,
            self.mzxid,
            self.ctime_ms,
            self.mtime_ms,
            self.version,
            self.cversion,
            0,
            self.ephemeral_owner,
            len(self.data),
            len(self.children),
            self.pzxid,
        )


def _parent(path: str) -> str:
    head = path.rsplit("/", 1)[0]
    return head or "/"


def _check_path(path: str) -> None:
    if not isinstance(path, str):
        raise TypeError("Invalid type for 'path' (string expected)")
    if not path.startswith("/") or (path != "/" and path.endswith("/")) or "//" in path:
        raise ValueError(f"invalid znode path {path!r}")


def _check_value(value: bytes) -> None:
    if not isinstance(value, bytes):
        raise TypeError("Invalid type for 'value' (must be a byte string)")


Watcher = Callable[[WatchedEvent], object]


class FakeZooKeeper:
    """The simulated ZooKeeper server: one znode tree shared by every session.

    `clock_ms` gives the virtual time stamped into ctime/mtime; `schedule(fn)` runs a watch
    callback later (on the loop: never inside the call that fired it, as with kazoo)."""

    def __init__(
        self,
        clock_ms: Callable[[], int] = lambda: 0,
        schedule: Callable[[Callable[[], object]], object] | None = None,
    ) -> None:
        self._clock_ms = clock_ms
        self._schedule = schedule or (lambda fn: fn())
        self._zxid = 0
        self._nodes: dict[str, _Znode] = {"/": _Znode(b"", 0, 0, 0, 0)}
        self._next_session_id = 0x1000
        self.live_sessions: set[int] = set()
        self._data_watches: dict[str, list[Watcher]] = {}
        self._child_watches: dict[str, list[Watcher]] = {}
        # Called with (path, data) after every successful create/set of a znode (the
        # simulator's checker follows the streams' meta through it).
        self.on_write: list[Callable[[str, bytes], None]] = []

    # ------------------------------------------------------------------ sessions

    def open_session(self) -> int:
        """Returns a new live session id."""
        self._next_session_id += 1
        self.live_sessions.add(self._next_session_id)
        return self._next_session_id

    def expire_session(self, session_id: int) -> list[str]:
        """Ends `session_id`: its ephemeral znodes are deleted (watches fire); returns their
        paths."""
        if session_id not in self.live_sessions:
            return []
        self.live_sessions.discard(session_id)
        owned = sorted(
            (p for p, n in self._nodes.items() if n.ephemeral_owner == session_id),
            key=lambda p: (-p.count("/"), p),
        )
        for path in owned:
            if path in self._nodes:
                self._remove(path)
        return owned

    def later(self, fn: Callable[[], object]) -> None:
        """Runs `fn` later, as a watch callback runs (kazoo's recipes spawn their work so)."""
        self._schedule(fn)

    def connect(self) -> FakeKazooClient:
        """Returns a client with a new session."""
        return FakeKazooClient(self)

    # ------------------------------------------------------------------ reads

    def node(self, path: str) -> _Znode:
        node = self._nodes.get(path)
        if node is None:
            raise NoNodeError(path)
        return node

    def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, ZnodeStat]:
        _check_path(path)
        node = self.node(path)
        if watch is not None:
            self._data_watches.setdefault(path, []).append(watch)
        return node.data, node.stat()

    def exists(self, path: str, watch: Watcher | None = None) -> ZnodeStat | None:
        _check_path(path)
        if watch is not None:
            self._data_watches.setdefault(path, []).append(watch)
        node = self._nodes.get(path)
        return None if node is None else node.stat()

    def get_children(self, path: str, watch: Watcher | None = None) -> list[str]:
        _check_path(path)
        node = self.node(path)
        if watch is not None:
            self._child_watches.setdefault(path, []).append(watch)
        return sorted(node.children)

    # ------------------------------------------------------------------ writes (checks first)

    def _check_create(self, path: str, ephemeral: bool, sequence: bool) -> str:
        """Returns the path a create would make; raises what ZooKeeper answers."""
        _check_path(path)
        if path == "/":
            raise NodeExistsError(path)
        parent = self._nodes.get(_parent(path))
        if parent is None:
            raise NoNodeError(path)
        if parent.ephemeral_owner:
            raise NoChildrenForEphemeralsError(path)
        if sequence:
            path = f"{path}{parent.cversion:010d}"
        if path in self._nodes:
            raise NodeExistsError(path)
        return path

    def _check_version(self, path: str, version: int) -> _Znode:
        node = self.node(path)
        if version != -1 and node.version != version:
            raise BadVersionError(path)
        return node

    def _check_delete(self, path: str, version: int) -> None:
        _check_path(path)
        if path == "/":
            raise BadArgumentsError(path)
        node = self._check_version(path, version)
        if node.children:
            raise NotEmptyError(path)

    def _apply_create(self, path: str, value: bytes, owner: int) -> str:
        self._zxid += 1
        now = self._clock_ms()
        self._nodes[path] = _Znode(value, self._zxid, self._zxid, now, now, ephemeral_owner=owner)
        parent = self._nodes[_parent(path)]
        parent.children.add(path.rsplit("/", 1)[1])
        parent.cversion += 1
        parent.pzxid = self._zxid
        self._fire(self._data_watches, path, EventType.CREATED)
        self._fire(self._child_watches, _parent(path), EventType.CHILD)
        for hook in self.on_write:
            hook(path, value)
        return path

    def _apply_set(self, path: str, value: bytes) -> ZnodeStat:
        self._zxid += 1
        node = self._nodes[path]
        node.data = value
        node.version += 1
        node.mzxid = self._zxid
        node.mtime_ms = self._clock_ms()
        self._fire(self._data_watches, path, EventType.CHANGED)
        for hook in self.on_write:
            hook(path, value)
        return node.stat()

    def _remove(self, path: str) -> None:
        self._zxid += 1
        del self._nodes[path]
        parent = self._nodes[_parent(path)]
        parent.children.discard(path.rsplit("/", 1)[1])
        parent.cversion += 1
        parent.pzxid = self._zxid
        self._fire(self._data_watches, path, EventType.DELETED)
        self._fire(self._child_watches, path, EventType.DELETED)
        self._fire(self._child_watches, _parent(path), EventType.CHILD)

    def _fire(self, watches: dict[str, list[Watcher]], path: str, kind: str) -> None:
        callbacks = watches.pop(path, None)
        if not callbacks:
            return
        event = WatchedEvent(kind, KazooState.CONNECTED, path)
        for callback in callbacks:
            self._schedule(functools.partial(callback, event))

    # ------------------------------------------------------------------ the API

    def create(
        self, path: str, value: bytes, *, ephemeral: bool, sequence: bool, session_id: int
    ) -> str:
        _check_value(value)
        path = self._check_create(path, ephemeral, sequence)
        return self._apply_create(path, value, session_id if ephemeral else 0)

    def set(self, path: str, value: bytes, version: int) -> ZnodeStat:
        _check_path(path)
        _check_value(value)
        self._check_version(path, version)
        return self._apply_set(path, value)

    def delete(self, path: str, version: int) -> None:
        self._check_delete(path, version)
        self._remove(path)

    def multi(self, ops: Sequence[tuple[Any, ...]], session_id: int) -> list[Any]:
        """Runs a multi-op atomically; returns kazoo's per-op results: on success the path of
        each create, the stat of each set_data and True for each delete and check; on failure
        `RolledBackError()` for the ops before the failing one, its error, and
        `RuntimeInconsistency()` for the ops after it (nothing applied)."""
        # Validate against a scratch view of the tree by applying to a copy of the state.
        saved_nodes = {p: _copy(n) for p, n in self._nodes.items()}
        saved_zxid = self._zxid
        saved_hooks, self.on_write = self.on_write, []
        saved_data = {p: list(w) for p, w in self._data_watches.items()}
        saved_child = {p: list(w) for p, w in self._child_watches.items()}
        scheduled: list[Callable[[], object]] = []
        saved_schedule, self._schedule = self._schedule, scheduled.append
        results: list[Any] = []
        writes: list[tuple[str, bytes]] = []
        failed_at = -1
        try:
            for index, op in enumerate(ops):
                kind = op[0]
                try:
                    if kind == "create":
                        _, path, value, ephemeral, sequence = op
                        _check_value(value)
                        made = self._check_create(path, ephemeral, sequence)
                        results.append(
                            self._apply_create(made, value, session_id if ephemeral else 0)
                        )
                        writes.append((made, value))
                    elif kind == "set_data":
                        _, path, value, version = op
                        _check_value(value)
                        self._check_version(path, version)
                        results.append(self._apply_set(path, value))
                        writes.append((path, value))
                    elif kind == "delete":
                        _, path, version = op
                        self._check_delete(path, version)
                        self._remove(path)
                        results.append(True)
                    elif kind == "check":
                        _, path, version = op
                        self._check_version(path, version)
                        results.append(True)
                    else:
                        raise ValueError(f"unknown multi-op kind {kind!r}")
                except (
                    NoNodeError,
                    NodeExistsError,
                    BadVersionError,
                    NotEmptyError,
                    NoChildrenForEphemeralsError,
                    BadArgumentsError,
                ) as error:
                    failed_at = index
                    results = [RolledBackError() for _ in range(index)]
                    results.append(error)
                    results.extend(RuntimeInconsistency() for _ in range(index + 1, len(ops)))
                    break
        finally:
            self._schedule = saved_schedule
            self.on_write = saved_hooks
        if failed_at >= 0:
            self._nodes, self._zxid = saved_nodes, saved_zxid
            self._data_watches, self._child_watches = saved_data, saved_child
            return results
        for fn in scheduled:
            self._schedule(fn)
        for path, value in writes:
            for hook in self.on_write:
                hook(path, value)
        return results

    # ------------------------------------------------------------------ for the simulator

    def paths(self) -> list[str]:
        """Returns every znode path, sorted (tests and traces)."""
        return sorted(self._nodes)

    def peek(self, path: str) -> bytes | None:
        """Returns a znode's data without a session (the checker's view), None if absent."""
        node = self._nodes.get(path)
        return None if node is None else node.data


def _copy(node: _Znode) -> _Znode:
    return _Znode(
        node.data,
        node.czxid,
        node.mzxid,
        node.ctime_ms,
        node.mtime_ms,
        node.version,
        node.cversion,
        node.ephemeral_owner,
        node.pzxid,
        set(node.children),
    )


class _Result:
    """What kazoo's `*_async` calls return: `get()` gives the value or raises the error."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value = value
        self._error = error

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class FakeTransaction:
    """kazoo's `TransactionRequest`: ops are collected, then committed as one multi-op."""

    def __init__(self, client: FakeKazooClient) -> None:
        self._client = client
        self._ops: list[tuple[Any, ...]] = []
        self.committed = False

    def _add(self, op: tuple[Any, ...]) -> None:
        if self.committed:
            raise ValueError("Transaction already committed")
        self._ops.append(op)

    def create(
        self,
        path: str,
        value: bytes = b"",
        acl: Any = None,
        ephemeral: bool = False,
        sequence: bool = False,
    ) -> None:
        _check_value(value)
        self._add(("create", path, value, ephemeral, sequence))

    def delete(self, path: str, version: int = -1) -> None:
        self._add(("delete", path, version))

    def set_data(self, path: str, value: bytes, version: int = -1) -> None:
        _check_value(value)
        self._add(("set_data", path, value, version))

    def check(self, path: str, version: int) -> None:
        self._add(("check", path, version))

    def commit(self) -> list[Any]:
        if self.committed:
            raise ValueError("Transaction already committed")
        self.committed = True
        ops = self._ops
        return self._client._call(
            lambda sid: self._client.server.multi(ops, sid), write=True, kind="multi"
        )

    def commit_async(self) -> _Result:
        try:
            return _Result(self.commit())
        except Exception as e:
            return _Result(error=e)


class _SimHandler:
    """What kazoo's recipes (`ChildrenWatch`, `DataWatch`, a `Lock` that does not block) ask of
    a client's handler: locks, events, a way to run a call later (on the loop, as watch
    callbacks run) and a sleep between their retries (never a real one)."""

    def __init__(self, schedule: Callable[[Callable[[], object]], object]) -> None:
        self._schedule = schedule

    def lock_object(self) -> threading.RLock:
        return threading.RLock()

    def event_object(self) -> threading.Event:
        return threading.Event()

    def spawn(self, fn: Callable[..., object], *args: Any, **kwargs: Any) -> None:
        self._schedule(lambda: fn(*args, **kwargs))

    def sleep_func(self, seconds: float) -> None:
        """Retries of a simulated call happen at the same virtual instant."""


class FakeKazooClient:
    """One session's client on a `FakeZooKeeper`, with kazoo's method names and errors.

    `expire()` ends the session (ephemerals go at once); calls then raise
    `SessionExpiredError` until `reconnect_at` (virtual seconds, from `now`), after which the
    client has a new session, as kazoo reconnects by itself. `lose_reply(kind)` (a fault hook:
    returns True to lose it) makes an applied write raise `ConnectionLoss`."""

    def __init__(
        self,
        server: FakeZooKeeper,
        *,
        now: Callable[[], float] = lambda: 0.0,
        lose_reply: Callable[[str], bool] | None = None,
    ) -> None:
        self.server = server
        self._now = now
        self.lose_reply = lose_reply
        self.session_id: int | None = server.open_session()
        self.generation = 1
        self.reconnect_at: float | None = None
        self.closed = False
        self.state_listeners: list[Callable[[str], None]] = []
        self.default_acl = None
        self.handler = _SimHandler(server.later)

    # ------------------------------------------------------------------ session

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        self._maybe_reconnect()
        return None if self.session_id is None else (self.session_id, b"")

    @property
    def connected(self) -> bool:
        self._maybe_reconnect()
        return self.session_id is not None and not self.closed

    def expire(self, reconnect_after_s: float) -> None:
        """Expires the session now; a new one is made `reconnect_after_s` later."""
        if self.session_id is None:
            return
        self.server.expire_session(self.session_id)
        self.session_id = None
        self.reconnect_at = self._now() + reconnect_after_s
        for listener in list(self.state_listeners):
            listener(KazooState.LOST)

    def _maybe_reconnect(self) -> None:
        if (
            self.session_id is None
            and not self.closed
            and self.reconnect_at is not None
            and self._now() >= self.reconnect_at
        ):
            self.session_id = self.server.open_session()
            self.generation += 1
            self.reconnect_at = None
            for listener in list(self.state_listeners):
                listener(KazooState.CONNECTED)

    def stop(self) -> None:
        if self.session_id is not None:
            self.server.expire_session(self.session_id)
        self.session_id = None
        self.closed = True

    close = stop

    def add_listener(self, listener: Callable[[str], None]) -> None:
        self.state_listeners.append(listener)

    def remove_listener(self, listener: Callable[[str], None]) -> None:
        if listener in self.state_listeners:
            self.state_listeners.remove(listener)

    def _call(self, fn: Callable[[int], T], *, write: bool, kind: str) -> T:
        if self.closed:
            raise ConnectionClosedError("Connection has been closed")
        self._maybe_reconnect()
        sid = self.session_id
        if sid is None or sid not in self.server.live_sessions:
            raise SessionExpiredError()
        result = fn(sid)
        if write and self.lose_reply is not None and self.lose_reply(kind):
            raise ConnectionLoss()
        return result

    # ------------------------------------------------------------------ kazoo's API

    def create(
        self,
        path: str,
        value: bytes = b"",
        acl: Any = None,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
        include_data: bool = False,
    ) -> str:
        def run(sid: int) -> str:
            if makepath:
                self._make_parents(path)
            return self.server.create(
                path, value, ephemeral=ephemeral, sequence=sequence, session_id=sid
            )

        return self._call(run, write=True, kind="create")

    def _make_parents(self, path: str) -> None:
        parts = path.strip("/").split("/")[:-1]
        current = ""
        for part in parts:
            current += "/" + part
            if self.server.exists(current) is None:
                self.server.create(current, b"", ephemeral=False, sequence=False, session_id=0)

    def ensure_path(self, path: str, acl: Any = None) -> bool:
        def run(sid: int) -> bool:
            if self.server.exists(path) is None:
                self._make_parents(path + "/x")
            return True

        return self._call(run, write=True, kind="ensure_path")

    def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, ZnodeStat]:
        return self._call(lambda sid: self.server.get(path, watch), write=False, kind="get")

    def get_async(self, path: str, watch: Watcher | None = None) -> _Result:
        try:
            return _Result(self.get(path, watch))
        except Exception as e:
            return _Result(error=e)

    def exists(self, path: str, watch: Watcher | None = None) -> ZnodeStat | None:
        return self._call(lambda sid: self.server.exists(path, watch), write=False, kind="exists")

    def get_children(
        self, path: str, watch: Watcher | None = None, include_data: bool = False
    ) -> list[str]:
        return self._call(
            lambda sid: self.server.get_children(path, watch), write=False, kind="get_children"
        )

    def set(self, path: str, value: bytes, version: int = -1) -> ZnodeStat:
        return self._call(lambda sid: self.server.set(path, value, version), write=True, kind="set")

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> bool:
        def run(sid: int) -> bool:
            if recursive:
                for child in self.server.get_children(path):
                    run_child = f"{path.rstrip('/')}/{child}"
                    self.delete(run_child, recursive=True)
            self.server.delete(path, version)
            return True

        return self._call(run, write=True, kind="delete")

    def transaction(self) -> FakeTransaction:
        return FakeTransaction(self)

    def retry(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """kazoo's `retry`: calls `func` again after a lost connection (bounded here)."""
        for _ in range(_RETRY_ATTEMPTS - 1):
            try:
                return func(*args, **kwargs)
            except (ConnectionLoss, OperationTimeoutError):
                continue
        return func(*args, **kwargs)


class SimMetadataSession:
    """What `StreamStore` and `BookieRegistry` need of a `MetadataSession`, over a
    `FakeKazooClient` and without threads: `zk`, `retry`, `session_id`,
    `session_generation`, `retry_deadline_s`, `session_timeout_s`, listeners."""

    def __init__(self, zk: FakeKazooClient, *, session_timeout_s: float = 1.0) -> None:
        self._zk = zk
        self.session_timeout_s = session_timeout_s
        self.retry_deadline_s = session_timeout_s
        self.root = "/"
        self.hosts = "sim"
        self.closed = False
        self._listeners: list[SessionListener] = []
        zk.add_listener(self._on_state)

    @property
    def zk(self) -> FakeKazooClient:
        return self._zk

    @property
    def session_id(self) -> int | None:
        return None if self._zk.client_id is None else self._zk.session_id

    @property
    def session_id_hex(self) -> str | None:
        sid = self.session_id
        return None if sid is None else f"0x{sid:x}"

    @property
    def session_generation(self) -> int:
        self._zk._maybe_reconnect()
        return self._zk.generation

    def add_session_listener(self, callback: SessionListener) -> None:
        self._listeners.append(callback)

    def remove_session_listener(self, callback: SessionListener) -> None:
        if callback in self._listeners:
            self._listeners.remove(callback)

    def _on_state(self, state: str) -> None:
        event = SessionState.CONNECTED if state == KazooState.CONNECTED else SessionState.LOST
        for listener in list(self._listeners):
            listener(event)

    def retry(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Returns `func(*args, **kwargs)`, retried after connection losses (a bounded number
        of times); session expiry raises `MetadataSessionExpiredError`, as the real one."""
        for _ in range(_RETRY_ATTEMPTS):
            try:
                return func(*args, **kwargs)
            except (ConnectionLoss, OperationTimeoutError):
                continue
            except SessionExpiredError as exc:
                if isinstance(exc, ConnectionClosedError):
                    raise MetadataError("metadata session is closed") from exc
                raise MetadataSessionExpiredError("ZooKeeper session expired") from exc
        raise MetadataError("ZooKeeper did not answer in time", deadline_s=self.retry_deadline_s)

    def close(self) -> None:
        self.closed = True
        self._zk.stop()


class SimMetadata(ZkMetadata):
    """The client's `MetadataPort` in simulation: every call crosses the simulated network from
    `node` to the ZooKeeper node, runs the real `StreamStore`/`BookieRegistry` call there at one
    virtual instant, and its answer (or error) crosses back. The port's methods are
    `ZkMetadata`'s; only how a call runs, and how a watch is delivered, differ."""

    def __init__(self, network: SimNetwork, node: str, session: SimMetadataSession) -> None:
        # Not super().__init__: that would start the real port's thread pool.
        self._network = network
        self.node = node
        self.session = session  # type: ignore[assignment]
        self.store = StreamStore(session, clock_ms=network.now_ms)  # type: ignore[arg-type]
        self.registry = BookieRegistry(session)  # type: ignore[arg-type]
        self.cursors = CursorStore(session, clock_ms=network.now_ms)  # type: ignore[arg-type]
        self._addresses = {}
        self._data_addresses = {}

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self._network.call_zk(self.node, functools.partial(fn, *args, **kwargs))

    def watch_meta(
        self, stream_id: int, callback: Callable[[int | None], None]
    ) -> Callable[[], None]:
        """Calls `callback(version)` on the loop after each change of the stream's meta (one
        network hop later), `callback(None)` once it is deleted; returns the stop function."""
        from stream.metadata import paths

        path = paths.stream_meta(stream_id)
        server = self.session.zk.server
        stopped = False

        def arm() -> None:
            if stopped:
                return
            server.exists(path, watch=on_event)

        def on_event(event: WatchedEvent) -> None:
            if stopped:
                return
            stat = server.exists(path)
            version = None if stat is None else stat.version

            def deliver() -> None:
                if not stopped:
                    callback(version)

            self._network.notify(ZK_NODE, self.node, deliver)
            if stat is not None:
                arm()

        def stop() -> None:
            nonlocal stopped
            stopped = True

        arm()
        return stop

    def close(self) -> None:
        """Nothing to stop (no thread pool in simulation)."""
