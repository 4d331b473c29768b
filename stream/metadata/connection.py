"""ZooKeeper sessions for the metadata layer: connect-string parsing, a kazoo client chrooted at
the metadata root with its base layout, session-loss signals, and retries under a deadline that
never hide a session expiry."""

from __future__ import annotations

import enum
import ipaddress
import queue
import re
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionClosedError,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.retry import KazooRetry, RetryFailedError

from stream.errors import (
    InvalidArgumentError,
    MetadataError,
    MetadataUnavailableError,
    PermissionDeniedError,
)

# Defined with the other errors (`streamctl`'s exit codes need it without kazoo); still importable
# from here.
from stream.errors import MetadataSessionExpiredError as MetadataSessionExpiredError
from stream.logs import get_logger
from stream.metadata import paths
from stream.metadata.auth import MetadataAuth, load_metadata_auth

log = get_logger(__name__)

T = TypeVar("T")

DEFAULT_ROOT = "/streamkeeper"

_HOST_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"^{_HOST_LABEL}(?:\.{_HOST_LABEL})*$")
_PORT = re.compile(r"^[0-9]{1,5}$")
_ROOT_SEGMENT = re.compile(r"^[A-Za-z0-9._-]{1,255}$")
_ROOT_MAX_CHARS = 1024


class SessionState(enum.StrEnum):
    """What happened to the ZooKeeper session, as given to session listeners."""

    CONNECTED = "CONNECTED"  # connected: a new session when `session_generation` moved
    SUSPENDED = "SUSPENDED"  # connection lost; the session (and its ephemerals) may live on
    LOST = "LOST"  # the session expired or was closed: its ephemeral znodes are gone


SessionListener = Callable[[SessionState], None]


def _check_host_port(entry: str, connect_string: str) -> None:
    """Returns None when `entry` is HOST[:PORT] (HOST a name, IPv4 or [IPv6]); else raises."""
    if entry.startswith("["):
        end = entry.find("]")
        host, rest = entry[1:end], entry[end + 1 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            host = ""
        if end < 0 or not host or (rest and not rest.startswith(":")):
            raise InvalidArgumentError(
                "bad ZooKeeper host", connect_string=connect_string, host=entry
            )
        port = rest[1:] if rest else None
    else:
        host, sep, port_text = entry.partition(":")
        if len(host) > 253 or not _HOSTNAME.match(host):
            raise InvalidArgumentError(
                "bad ZooKeeper host", connect_string=connect_string, host=entry
            )
        port = port_text if sep else None
    if port is not None and not (_PORT.match(port) and 0 < int(port) < 65536):
        raise InvalidArgumentError(
            "bad ZooKeeper port (1-65535)", connect_string=connect_string, host=entry
        )


def _check_root(root: str, connect_string: str) -> None:
    """Returns None when `root` is an absolute znode path we accept as a chroot; else raises."""
    segments = root[1:].split("/")
    if (
        len(root) > _ROOT_MAX_CHARS
        or not root.startswith("/")
        or any(not _ROOT_SEGMENT.match(s) or s in (".", "..") for s in segments)
        # /zookeeper is ZooKeeper's own subtree.
        or segments[0] == "zookeeper"
    ):
        raise InvalidArgumentError(
            "bad metadata root: an absolute path of segments of [A-Za-z0-9._-], not /zookeeper",
            connect_string=connect_string,
            root=root,
        )


def parse_connect_string(connect_string: str) -> tuple[str, str]:
    """Returns `(hosts, root)` for a `HOST[:PORT][,HOST[:PORT]...][/ROOT]` connect string;
    the root defaults to `/streamkeeper`. Raises `InvalidArgumentError` on anything else."""
    if not isinstance(connect_string, str):
        raise InvalidArgumentError("connect string must be a str", connect_string=connect_string)
    text = connect_string.strip()
    hosts, slash, path = text.partition("/")
    if not hosts:
        raise InvalidArgumentError(
            "connect string needs HOST:PORT[/ROOT]", connect_string=connect_string
        )
    for entry in hosts.split(","):
        _check_host_port(entry, connect_string)
    root = "/" + path if slash else DEFAULT_ROOT
    _check_root(root, connect_string)
    return hosts, root


class MetadataSession:
    """A ZooKeeper session chrooted at the metadata root (`zk`), with retries (`retry`) and
    session-loss signals (`session_generation`, `add_session_listener`). Build it with
    `MetadataSession.connect(...)`; close it with `close()` (or use it as a context manager).
    """

    def __init__(
        self,
        zk: KazooClient,
        *,
        hosts: str,
        root: str,
        session_timeout_s: float,
        retry_deadline_s: float,
        auth: MetadataAuth | None = None,
    ) -> None:
        """Wraps a kazoo client that is not started yet; prefer `MetadataSession.connect`."""
        self._zk = zk
        self.auth = auth
        self.hosts = hosts
        self.root = root
        self.session_timeout_s = session_timeout_s
        self.retry_deadline_s = retry_deadline_s
        self._lock = threading.Lock()
        self._session_id: int | None = None
        self._generation = 0
        self._closed = False
        self._listeners: list[SessionListener] = []
        # Listeners run on our own thread, in order: kazoo calls state listeners on its
        # connection thread, where blocking (e.g. a ZooKeeper call) would stall the session.
        self._events: queue.Queue[SessionState | None] = queue.Queue()
        self._notifier = threading.Thread(
            target=self._notify_loop, name="streamkeeper-zk-session", daemon=True
        )
        self._notifier.start()
        zk.add_listener(self._on_kazoo_state)

    @classmethod
    def connect(
        cls,
        connect_string: str,
        timeout_s: float = 10.0,
        session_timeout_s: float = 10.0,
        *,
        retry_deadline_s: float | None = None,
        auth_file: str | Path | None = None,
    ) -> MetadataSession:
        """Returns a connected session chrooted at the connect string's root, having created
        the root and the base layout (`/streams/by-name`, `/bookies/available`,
        `/bookies/cookies`, `/underreplicated`, the stream id counter) when missing.

        `timeout_s` bounds each connection attempt; `session_timeout_s` is the ZooKeeper session
        timeout asked for; `retry_deadline_s` (default: the session timeout) bounds the retries of
        one call on connection loss. `auth_file` (the `metadata_auth_file`, see
        `stream.metadata.auth`) names the identity to authenticate as; every znode this session
        creates then carries its ACL. Raises `InvalidArgumentError` for a bad connect string,
        `ConfigError` for a bad auth file, `PermissionDeniedError` when ZooKeeper does not let
        this identity read the root, and `MetadataError` when ZooKeeper cannot be reached in
        time."""
        hosts, root = parse_connect_string(connect_string)
        auth = None if auth_file is None else load_metadata_auth(auth_file)
        if not (timeout_s > 0 and session_timeout_s > 0):
            raise InvalidArgumentError(
                "timeouts must be > 0", timeout_s=timeout_s, session_timeout_s=session_timeout_s
            )
        deadline_s = session_timeout_s if retry_deadline_s is None else retry_deadline_s
        zk = KazooClient(
            hosts=hosts + root,
            timeout=session_timeout_s,
            **kazoo_auth_options(auth),
            # Reconnect forever: a bookie keeps serving through ZooKeeper outages and must get
            # its session back (a new one after expiry) without a restart.
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 2.0},
        )
        session = cls(
            zk,
            hosts=hosts,
            root=root,
            session_timeout_s=session_timeout_s,
            retry_deadline_s=deadline_s,
            auth=auth,
        )
        try:
            _start(zk, hosts=hosts, timeout_s=timeout_s)
        except MetadataUnavailableError:
            session._give_up()
            raise
        try:
            # The root usually exists: then this is the only session, and the layout is
            # checked in one round trip (a Spark query's driver connects at every start).
            if not session._check_readable():
                _ensure_root(
                    hosts, root, timeout_s=timeout_s, session_timeout_s=session_timeout_s, auth=auth
                )
                if not session._check_readable():
                    raise MetadataError("the metadata root was deleted while connecting", root=root)
            session._create_base_layout()
            session._warn_if_open()
        except BaseException:
            session.close()
            raise
        log.info(
            "metadata.connected",
            hosts=hosts,
            root=root,
            session=session.session_id_hex,
            user=None if auth is None else auth.user,
        )
        return session

    def _check_readable(self) -> bool:
        """Returns True when this identity may read the root, False when there is no root;
        else raises `PermissionDeniedError` at once, rather than at some later call: with a
        wrong password (ZooKeeper's digest scheme accepts any credentials, it just matches no
        ACL) or no auth file for a root that has ACLs, nothing else would work either."""
        try:
            self.retry(self._zk.get_children, "/")
        except NoNodeError:
            return False
        except PermissionDeniedError as exc:
            raise PermissionDeniedError(
                "ZooKeeper does not let this identity read the metadata root: "
                + (
                    "wrong password, or not listed in the root's ACL"
                    if self.auth is not None
                    else "it has ACLs, give its metadata auth file"
                ),
                root=self.root,
                user=None if self.auth is None else self.auth.user,
            ) from exc
        return True

    def _any_missing(self, znodes: tuple[str, ...]) -> bool:
        """Returns whether any of `znodes` is missing, asking for all of them at once (one
        round trip, not one per znode). Any trouble getting the answers also returns True:
        the caller's retried calls then meet it and raise the true error."""
        try:
            asked = [self._zk.exists_async(znode) for znode in znodes]
            return any(answer.get(timeout=self.retry_deadline_s) is None for answer in asked)
        except Exception:
            return True

    def _warn_if_open(self) -> None:
        """Logs a warning when this session authenticates but the root is open to anyone:
        it was created before there was an auth file, and its znodes keep their ACLs."""
        if self.auth is None:
            return
        acls, _ = self.retry(self._zk.get_acls, "/")
        if any(acl.id.scheme == "world" for acl in acls):
            log.warning(
                "metadata.root_open_to_anyone",
                root=self.root,
                hint="ACLs are set when a znode is created: use a new root with the auth file",
            )

    def _create_base_layout(self) -> None:
        # Only what is missing is created (ensure_path and this look first): a read-only
        # identity connects to an existing layout without writing.
        if not self._any_missing((*paths.BASE_LAYOUT, paths.STREAMS_NEXT_ID)):
            return
        for path in paths.BASE_LAYOUT:
            self.retry(self._zk.ensure_path, path)
        if self.retry(self._zk.exists, paths.STREAMS_NEXT_ID) is not None:
            return
        try:
            # Stream ids start at 1; 0 is left free as a sentinel.
            self.retry(self._zk.create, paths.STREAMS_NEXT_ID, b"1")
        except NodeExistsError:
            pass

    @property
    def zk(self) -> KazooClient:
        """Returns the kazoo client, chrooted at the metadata root."""
        return self._zk

    @property
    def connect_string(self) -> str:
        """Returns `hosts + root`, the string this session was connected with (normalised)."""
        return self.hosts + self.root

    @property
    def session_id(self) -> int | None:
        """Returns the current ZooKeeper session id, or None while no session is established
        (after a LOST, until the next CONNECTED)."""
        with self._lock:
            return self._session_id

    @property
    def session_id_hex(self) -> str | None:
        """Returns `session_id` in ZooKeeper's usual hexadecimal spelling (for logs)."""
        sid = self.session_id
        return None if sid is None else f"0x{sid:x}"

    @property
    def session_generation(self) -> int:
        """Returns a counter that moves each time a new ZooKeeper session is established
        (1 after connect). A writer records it when it takes over; when it moved, the session
        expired meanwhile and the writer must re-check its term before writing again."""
        with self._lock:
            return self._generation

    @property
    def closed(self) -> bool:
        """Returns whether `close()` was called."""
        return self._closed

    def add_session_listener(self, callback: SessionListener) -> None:
        """Calls `callback(state)` for every later session state change (`SessionState`), in
        order, on the session's notifier thread: it may call ZooKeeper, but a slow callback
        delays the others."""
        with self._lock:
            self._listeners.append(callback)

    def remove_session_listener(self, callback: SessionListener) -> None:
        """Stops calling `callback`; returns silently when it was not registered."""
        with self._lock:
            if callback in self._listeners:
                self._listeners.remove(callback)

    def _on_kazoo_state(self, state: str) -> None:
        """Runs on kazoo's connection thread: records the session and queues the event."""
        if state == KazooState.CONNECTED:
            client_id = self._zk.client_id
            sid = client_id[0] if client_id else None
            with self._lock:
                new_session = sid != self._session_id
                if new_session:
                    self._session_id = sid
                    self._generation += 1
                generation = self._generation
            log.info(
                "metadata.session_connected",
                session=None if sid is None else f"0x{sid:x}",
                generation=generation,
                new_session=new_session,
            )
            event = SessionState.CONNECTED
        elif state == KazooState.SUSPENDED:
            log.warning("metadata.session_suspended", session=self.session_id_hex)
            event = SessionState.SUSPENDED
        else:
            with self._lock:
                lost, self._session_id = self._session_id, None
            if not self._closed:
                log.warning(
                    "metadata.session_lost", session=None if lost is None else f"0x{lost:x}"
                )
            event = SessionState.LOST
        self._events.put(event)

    def _notify_loop(self) -> None:
        while (event := self._events.get()) is not None:
            with self._lock:
                listeners = list(self._listeners)
            for listener in listeners:
                try:
                    listener(event)
                except Exception:
                    # One broken listener must not starve the others of session events.
                    log.exception("metadata.session_listener_failed", state=str(event))

    def retry(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Returns `func(*args, **kwargs)`, retried on connection loss until
        `retry_deadline_s`. Raises `MetadataError` when the deadline passes or the session is
        closed, and `MetadataSessionExpiredError` on session expiry, which is never retried.
        Other kazoo errors (NoNodeError, NodeExistsError, BadVersionError...) pass through.

        A retried create or versioned write may have succeeded before its reply was lost:
        callers make such calls idempotent (NodeExists -> read and compare)."""
        retry = KazooRetry(
            max_tries=-1,
            delay=0.05,
            backoff=2,
            max_delay=1.0,
            deadline=self.retry_deadline_s,
            ignore_expire=False,
        )
        try:
            result: T = retry(func, *args, **kwargs)  # kazoo is untyped
            return result
        except RetryFailedError as exc:
            raise MetadataUnavailableError(
                "ZooKeeper did not answer in time", deadline_s=self.retry_deadline_s
            ) from exc
        except SessionExpiredError as exc:
            raise MetadataSessionExpiredError("ZooKeeper session expired") from exc
        except ConnectionClosedError as exc:
            raise MetadataError("metadata session is closed") from exc
        except NoAuthError as exc:
            raise permission_denied(exc, self.auth) from exc

    def instance_id(self) -> str:
        """Returns the cluster's instance id (a uuid4 in `/instanceid`), creating it on first
        use; concurrent first uses agree on one value."""

        def get_or_create() -> bytes:
            try:
                return bytes(self._zk.get(paths.INSTANCE_ID)[0])
            except NoNodeError:
                pass
            candidate = str(uuid.uuid4()).encode()
            try:
                self._zk.create(paths.INSTANCE_ID, candidate)
                return candidate
            except NodeExistsError:
                # Another process won the race, or our create landed and its reply was lost.
                return bytes(self._zk.get(paths.INSTANCE_ID)[0])

        data = self.retry(get_or_create)
        try:
            return str(uuid.UUID(data.decode()))
        except (UnicodeDecodeError, ValueError) as exc:
            raise MetadataError("malformed instance id", path=paths.INSTANCE_ID) from exc

    def close(self) -> None:
        """Closes the ZooKeeper session (its ephemeral znodes go at once) and stops the
        notifier thread; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._zk.remove_listener(self._on_kazoo_state)
        try:
            self._zk.stop()
            self._zk.close()
        finally:
            self._events.put(None)
            if threading.current_thread() is not self._notifier:
                self._notifier.join(timeout=5)
        log.info("metadata.closed", root=self.root)

    def _give_up(self) -> None:
        """Closes a session that never connected, without waiting for kazoo (`_start`)."""
        with self._lock:
            self._closed = True
        self._zk.remove_listener(self._on_kazoo_state)
        self._events.put(None)

    def __enter__(self) -> MetadataSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def permission_denied(error: NoAuthError, auth: MetadataAuth | None) -> PermissionDeniedError:
    """Returns the error for a call ZooKeeper refused (NoAuth): not retried, since the same
    identity will be refused again."""
    return PermissionDeniedError(
        "ZooKeeper refused this identity (read-only, wrong password, or no metadata auth file)",
        user=None if auth is None else auth.user,
        error=type(error).__name__,
    )


def kazoo_auth_options(auth: MetadataAuth | None) -> dict[str, Any]:
    """Returns the KazooClient arguments that authenticate as `auth` and put its ACL on every
    znode created (ZooKeeper ACLs are per znode, never inherited); none without auth."""
    if auth is None:
        return {}
    return {"auth_data": auth.auth_data(), "default_acl": auth.acl()}


def _ensure_root(
    hosts: str,
    root: str,
    *,
    timeout_s: float,
    session_timeout_s: float,
    auth: MetadataAuth | None = None,
) -> None:
    """Creates the chroot path (and its missing parents, with `auth`'s ACL) with a
    short-lived unchrooted client: kazoo does not create a missing chroot, and every call of a
    client chrooted at a missing path fails."""
    zk = KazooClient(hosts=hosts, timeout=session_timeout_s, **kazoo_auth_options(auth))
    _start(zk, hosts=hosts, timeout_s=timeout_s)
    try:
        retry = KazooRetry(max_tries=-1, deadline=session_timeout_s, ignore_expire=False)
        retry(zk.ensure_path, root)
    except (RetryFailedError, SessionExpiredError) as exc:
        raise MetadataUnavailableError(
            "cannot create the metadata root", hosts=hosts, root=root
        ) from exc
    except NoAuthError as exc:
        raise PermissionDeniedError(
            "ZooKeeper does not let this identity create the metadata root",
            root=root,
            user=None if auth is None else auth.user,
        ) from exc
    finally:
        zk.stop()
        zk.close()


def _start(zk: KazooClient, *, hosts: str, timeout_s: float) -> None:
    """Starts `zk`, or raises `MetadataUnavailableError` after `timeout_s` and stops it on a
    thread of its own: kazoo's `stop()` waits for the connection attempt in flight, which a
    ZooKeeper that accepts connections but never answers holds for the whole session timeout,
    and the caller was promised an answer after `timeout_s`."""
    zk.start_async().wait(timeout=timeout_s)
    if zk.connected:
        return
    threading.Thread(target=_stop, args=(zk,), name="metadata-give-up", daemon=True).start()
    raise MetadataUnavailableError("cannot connect to ZooKeeper", hosts=hosts, timeout_s=timeout_s)


def _stop(zk: KazooClient) -> None:
    """Stops kazoo's reconnect thread (it would go on trying, and logging) and frees `zk`."""
    zk.stop()
    zk.close()


connect = MetadataSession.connect
