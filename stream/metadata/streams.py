"""Streams in ZooKeeper (docs/design.md §3): create/read/list/delete, and the term-atomic changes,
each one ZooKeeper multi-op that checks the `meta` znode's version.

Invariant that the consistent reads rely on: every change to a stream's fragment znodes (and
to anything else of the stream except its ephemeral `writer` and its consumers' `cursors`,
stream/metadata/cursors.py) rewrites `meta` in the same multi-op, so the meta version moves
with every change. A writer whose view is stale fails the CAS with `BadVersionError`, rereads,
sees the higher term and disengages."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from kazoo.exceptions import BadVersionError as KazooBadVersionError
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)
from kazoo.recipe.watchers import DataWatch

from stream.errors import (
    BadVersionError,
    InvalidArgumentError,
    InvalidTermError,
    MetadataError,
    StreamExistsError,
    StreamNotFoundError,
    StreamSealedError,
)
from stream.metadata import paths
from stream.metadata.connection import (
    MetadataSession,
    MetadataSessionExpiredError,
    permission_denied,
)
from stream.metadata.model import (
    MAX_ACCEPTED_LOSSES,
    MAX_STREAM_ID,
    AcceptedLoss,
    Fragment,
    ProducerChange,
    RetentionPolicy,
    StreamMeta,
    StreamState,
    WriterInfo,
    compact_term_history,
    validate_bookie_id,
    validate_stream_id,
    validate_stream_name,
)

log = structlog.get_logger(__name__)

# ZooKeeper refuses requests above jute.maxbuffer (1 MiB by default); a delete or a fragment
# znode costs well under 1 KiB, so this many ops stay far below it.
MAX_OPS_PER_MULTI = 1000
# Bounds on the loops that reread and retry after losing a race to another client.
_CREATE_ATTEMPTS = 32
_CAS_ATTEMPTS = 16
_SNAPSHOT_ATTEMPTS = 16
_DELETE_ATTEMPTS = 16
_WRITER_ATTEMPTS = 8
# How many of its last writes `meta` names by op id. A client whose reply was lost finds its
# own op among them however many same-term changes (trims, repairs: a few per minute at most)
# followed it before it could look; past that many it reports a version conflict.
OP_IDS_KEPT = 16


# The name design discussions use for the same condition.
MetadataVersionError = BadVersionError


@dataclass(frozen=True)
class _Op:
    """One operation of a ZooKeeper multi-op."""

    kind: str  # "create" | "set_data" | "delete"
    path: str
    data: bytes = b""
    version: int = -1

    def add_to(self, txn: Any) -> None:
        if self.kind == "create":
            txn.create(self.path, self.data)
        elif self.kind == "set_data":
            txn.set_data(self.path, self.data, self.version)
        elif self.kind == "delete":
            txn.delete(self.path, self.version)
        else:
            raise ValueError(f"unknown multi-op kind {self.kind!r}")


def _first_error(results: Sequence[Any]) -> tuple[int, Exception] | None:
    """Returns the index and error of the op that failed a multi-op, None when it succeeded.
    The ops around the failing one report RolledBack/RuntimeInconsistency, not the cause."""
    for index, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(
            result, RolledBackError | RuntimeInconsistency
        ):
            return index, result
    return None


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


class StreamStore:
    """The streams under the session's metadata root: their `meta`, fragments and writer
    znodes. Thread-safe (kazoo clients are); every method may raise `MetadataError` when
    ZooKeeper does not answer within the session's retry deadline."""

    def __init__(
        self, session: MetadataSession, *, clock_ms: Callable[[], int] | None = None
    ) -> None:
        """`clock_ms` gives wall-clock milliseconds for `created_ms` (a simulator passes its
        own)."""
        self._session = session
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)

    @property
    def _zk(self) -> Any:
        return self._session.zk

    # ---------------------------------------------------------------- reads

    def _read_meta(self, stream_id: int) -> tuple[StreamMeta, int, tuple[str, ...]]:
        """Returns the stream's meta, its znode version and the op ids of its last writes."""
        path = paths.stream_meta(stream_id)
        try:
            data, stat = self._session.retry(self._zk.get, path)
        except NoNodeError:
            raise StreamNotFoundError("stream not found", stream_id=stream_id) from None
        try:
            meta, op_ids = StreamMeta.from_json_with_ops(data)
        except MetadataError as exc:
            raise MetadataError(exc.message, path=path, **exc.context) from exc
        return meta, stat.version, op_ids

    def _read_meta_at(
        self, stream_id: int, expected_version: int, action: str
    ) -> tuple[StreamMeta, tuple[str, ...]]:
        """Returns the stream's meta and the op ids of its last writes when its znode is at
        `expected_version`; raises `BadVersionError` otherwise (no point building a multi-op
        that must fail)."""
        meta, version, op_ids = self._read_meta(stream_id)
        if version != expected_version:
            raise BadVersionError(
                "stream metadata changed",
                stream=meta.name,
                stream_id=stream_id,
                expected_version=expected_version,
                current_version=version,
                action=action,
            )
        return meta, op_ids

    def _fragment_ids(self, stream_id: int) -> list[int]:
        """Returns the first entry ids of the stream's fragment znodes, sorted."""
        try:
            names = self._session.retry(self._zk.get_children, paths.stream_fragments(stream_id))
        except NoNodeError:
            raise StreamNotFoundError("stream not found", stream_id=stream_id) from None
        return sorted(self._parse_fragment_name(stream_id, name) for name in names)

    @staticmethod
    def _parse_fragment_name(stream_id: int, name: str) -> int:
        if not name.isascii() or not name.isdigit():
            raise MetadataError("malformed fragment znode name", stream_id=stream_id, name=name)
        return int(name)

    def _read_fragments(self, stream_id: int) -> list[Fragment]:
        """Returns the stream's fragments sorted by first entry id (not a consistent snapshot
        on its own: see `get_snapshot`)."""
        parent = paths.stream_fragments(stream_id)

        def read_once() -> list[tuple[str, bytes]]:
            names = self._zk.get_children(parent)
            # Pipelined gets: one round trip's latency for the whole list.
            pending = [(name, self._zk.get_async(f"{parent}/{name}")) for name in names]
            found = []
            for name, result in pending:
                try:
                    found.append((name, result.get()[0]))
                except NoNodeError:
                    continue  # trimmed meanwhile: the caller's version check notices
            return found

        try:
            raw = self._session.retry(read_once)
        except NoNodeError:
            raise StreamNotFoundError("stream not found", stream_id=stream_id) from None
        fragments = []
        for name, data in raw:
            first = self._parse_fragment_name(stream_id, name)
            try:
                fragment = Fragment.from_json(data)
            except MetadataError as exc:
                raise MetadataError(exc.message, stream_id=stream_id, fragment=name) from exc
            if fragment.first_entry_id != first:
                raise MetadataError(
                    "fragment znode name and content disagree", stream_id=stream_id, name=name
                )
            fragments.append(fragment)
        fragments.sort(key=lambda f: f.first_entry_id)
        return fragments

    def get_snapshot(self, stream_id: int) -> tuple[StreamMeta, int, list[Fragment]]:
        """Returns `(meta, version, fragments)` as of one meta version: the fragments were
        read while the meta version stood still (every fragment change moves it)."""
        validate_stream_id(stream_id)
        for _ in range(_SNAPSHOT_ATTEMPTS):
            meta, version, _ = self._read_meta(stream_id)
            fragments = self._read_fragments(stream_id)
            stat = self._session.retry(self._zk.exists, paths.stream_meta(stream_id))
            if stat is None:
                raise StreamNotFoundError("stream not found", stream_id=stream_id)
            if stat.version == version:
                return meta, version, fragments
        raise MetadataError("stream metadata kept changing during a read", stream_id=stream_id)

    def _lookup_id(self, name: str) -> int | None:
        """Returns the id that `/streams/by-name/<name>` holds, None when absent."""
        path = paths.stream_by_name(name)
        try:
            data, _ = self._session.retry(self._zk.get, path)
        except NoNodeError:
            return None
        return self._parse_id(data, path)

    @staticmethod
    def _parse_id(data: bytes, path: str) -> int:
        try:
            return validate_stream_id(int(data.decode()))
        except (UnicodeDecodeError, ValueError, InvalidArgumentError) as exc:
            raise MetadataError("malformed stream id", path=path) from exc

    def get_stream(self, name: str) -> tuple[StreamMeta, int]:
        """Returns `(meta, meta znode version)` of stream `name`; raises
        `StreamNotFoundError`, or `InvalidArgumentError` for an invalid name."""
        validate_stream_name(name)
        stream_id = self._lookup_id(name)
        if stream_id is None:
            raise StreamNotFoundError("stream not found", stream=name)
        try:
            meta, version, _ = self._read_meta(stream_id)
        except StreamNotFoundError:
            raise StreamNotFoundError("stream not found", stream=name) from None
        return meta, version

    def get_stream_by_id(self, stream_id: int) -> tuple[StreamMeta, int]:
        """Returns `(meta, meta znode version)` of stream `stream_id`; raises
        `StreamNotFoundError`."""
        validate_stream_id(stream_id)
        meta, version, _ = self._read_meta(stream_id)
        return meta, version

    def list_streams(self) -> list[str]:
        """Returns the names of all streams, sorted."""
        return sorted(self._session.retry(self._zk.get_children, paths.STREAMS_BY_NAME))

    def stream_ids(self) -> list[int]:
        """Returns the ids of every stream directory under `/streams`, sorted (including one a
        crashed `delete_stream` left without meta)."""
        children = self._session.retry(self._zk.get_children, paths.STREAMS)
        return sorted(int(c) for c in children if c.isascii() and c.isdigit())

    def get_fragments(self, stream_id: int) -> list[Fragment]:
        """Returns the stream's fragments sorted by first entry id (a consistent snapshot)."""
        return self.get_snapshot(stream_id)[2]

    # ---------------------------------------------------------------- create / delete

    def create_stream(
        self,
        name: str,
        ensemble: int,
        write_quorum: int,
        ack_quorum: int,
        fragment_max_entries: int,
        fragment_max_bytes: int,
        fragment_max_age_s: float | None = None,
        retention: RetentionPolicy | None = None,
    ) -> StreamMeta:
        """Returns the new stream's meta (term 0, OPEN, no fragment: the first writer's
        takeover creates one). Idempotent: when the name exists with the same configuration
        (a create whose reply was lost, or a concurrent identical create) returns the existing
        stream; with another configuration raises `StreamExistsError`. Invalid arguments raise
        `InvalidArgumentError` before anything is written.

        The id comes from the `/streams/next-id` CAS counter in the same multi-op that creates
        the name, so an id is never handed out twice nor lost to a failed create."""
        # Checks everything (name, quorums, policies) before the first ZooKeeper write.
        wanted = StreamMeta(
            name=validate_stream_name(name),
            id=1,
            ensemble=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            fragment_max_entries=fragment_max_entries,
            fragment_max_bytes=fragment_max_bytes,
            fragment_max_age_s=fragment_max_age_s,
            retention=retention,
        )
        deadline = time.monotonic() + self._session.retry_deadline_s
        for _ in range(_CREATE_ATTEMPTS):
            # Looking first also settles a previous attempt whose reply was lost.
            existing_id = self._lookup_id(name)
            if existing_id is not None:
                try:
                    existing, _, _ = self._read_meta(existing_id)
                except StreamNotFoundError:
                    continue  # being deleted right now
                if existing.same_config(wanted):
                    return existing
                raise StreamExistsError(
                    "stream exists with another configuration", stream=name, stream_id=existing_id
                )
            stream_id, counter_version = self._next_stream_id()
            meta = wanted.replace(id=stream_id, created_ms=self._clock_ms())
            ops = [
                _Op("create", paths.stream_by_name(name), str(stream_id).encode()),
                _Op(
                    "set_data", paths.STREAMS_NEXT_ID, str(stream_id + 1).encode(), counter_version
                ),
                _Op("create", paths.stream(stream_id)),
                _Op("create", paths.stream_meta(stream_id), meta.to_json()),
                _Op("create", paths.stream_fragments(stream_id)),
            ]
            try:
                results = self._commit(ops)
            except (ConnectionLoss, OperationTimeoutError) as exc:
                if time.monotonic() >= deadline:
                    raise MetadataError(
                        "ZooKeeper did not answer in time; the create may have happened",
                        stream=name,
                    ) from exc
                continue
            failure = _first_error(results)
            if failure is None:
                log.info("metadata.stream_created", stream=name, stream_id=stream_id)
                return meta
            index, error = failure
            if (index, type(error)) in ((0, NodeExistsError), (1, KazooBadVersionError)):
                continue  # the name appeared or another create took this id: look again
            raise MetadataError(
                "stream create failed",
                stream=name,
                stream_id=stream_id,
                path=ops[index].path,
                error=type(error).__name__,
            )
        raise MetadataError("stream create kept conflicting with others", stream=name)

    def _next_stream_id(self) -> tuple[int, int]:
        """Returns the counter's next stream id and the counter znode's version."""
        try:
            data, stat = self._session.retry(self._zk.get, paths.STREAMS_NEXT_ID)
        except NoNodeError:
            try:
                self._session.retry(self._zk.create, paths.STREAMS_NEXT_ID, b"1")
            except NodeExistsError:
                pass
            data, stat = self._session.retry(self._zk.get, paths.STREAMS_NEXT_ID)
        try:
            next_id = int(data.decode())
        except (UnicodeDecodeError, ValueError) as exc:
            raise MetadataError("malformed stream id counter", path=paths.STREAMS_NEXT_ID) from exc
        if not 1 <= next_id <= MAX_STREAM_ID:
            raise MetadataError("stream id counter out of range", next_id=next_id)
        return next_id, stat.version

    def delete_stream(self, name: str) -> None:
        """Deletes stream `name` and all its znodes (writer included) in one multi-op when they
        fit in one; raises `StreamNotFoundError`. A bigger stream first loses its name and
        meta atomically (it is gone for everyone), then its remaining znodes in batches."""
        validate_stream_name(name)
        ambiguous = False
        deadline = time.monotonic() + self._session.retry_deadline_s
        by_name = paths.stream_by_name(name)
        for _ in range(_DELETE_ATTEMPTS):
            try:
                data, name_stat = self._session.retry(self._zk.get, by_name)
            except NoNodeError:
                if ambiguous:
                    return  # our own multi-op landed before its reply was lost
                raise StreamNotFoundError("stream not found", stream=name) from None
            stream_id = self._parse_id(data, by_name)
            meta_stat = self._session.retry(self._zk.exists, paths.stream_meta(stream_id))
            writer_stat = self._session.retry(self._zk.exists, paths.stream_writer(stream_id))
            try:
                fragment_names = self._session.retry(
                    self._zk.get_children, paths.stream_fragments(stream_id)
                )
            except NoNodeError:
                fragment_names = []
            cursors = self._cursor_paths(stream_id)
            ops = [_Op("delete", by_name, version=name_stat.version)]
            if meta_stat is not None:
                ops.append(_Op("delete", paths.stream_meta(stream_id), version=meta_stat.version))
            whole = len(fragment_names) + len(cursors) + 5 <= MAX_OPS_PER_MULTI
            if whole:
                parent = paths.stream_fragments(stream_id)
                ops += [_Op("delete", f"{parent}/{f}") for f in fragment_names]
                ops += [_Op("delete", p) for p in cursors]
                if writer_stat is not None:
                    ops.append(
                        _Op("delete", paths.stream_writer(stream_id), version=writer_stat.version)
                    )
                ops += [_Op("delete", parent), _Op("delete", paths.stream(stream_id))]
            try:
                results = self._commit(ops)
            except (ConnectionLoss, OperationTimeoutError) as exc:
                if time.monotonic() >= deadline:
                    raise MetadataError(
                        "ZooKeeper did not answer in time; the delete may have happened",
                        stream=name,
                    ) from exc
                ambiguous = True
                continue
            failure = _first_error(results)
            if failure is not None:
                index, error = failure
                if isinstance(error, KazooBadVersionError | NoNodeError | NotEmptyError):
                    continue  # something changed between our reads and the multi-op
                raise MetadataError(
                    "stream delete failed",
                    stream=name,
                    path=ops[index].path,
                    error=type(error).__name__,
                )
            if not whole:
                self._purge_stream_dir(stream_id)
            log.info("metadata.stream_deleted", stream=name, stream_id=stream_id)
            return
        raise MetadataError("stream delete kept conflicting with others", stream=name)

    def _cursor_paths(self, stream_id: int) -> list[str]:
        """Returns the stream's cursor znodes and, when there is one, their parent (last)."""
        parent = paths.stream_cursors(stream_id)
        try:
            names = self._session.retry(self._zk.get_children, parent)
        except NoNodeError:
            return []
        return [*(f"{parent}/{n}" for n in names), parent]

    def _purge_stream_dir(self, stream_id: int) -> None:
        """Deletes whatever remains under `/streams/<id>` (idempotent), in batched multi-ops."""
        parent = paths.stream_fragments(stream_id)
        try:
            names = self._session.retry(self._zk.get_children, parent)
        except NoNodeError:
            names = []
        leftovers = [f"{parent}/{n}" for n in names] + self._cursor_paths(stream_id)
        leftovers += [paths.stream_writer(stream_id), parent, paths.stream(stream_id)]
        for start in range(0, len(leftovers), MAX_OPS_PER_MULTI):
            batch = leftovers[start : start + MAX_OPS_PER_MULTI]
            results = self._session.retry(self._commit, [_Op("delete", p) for p in batch])
            if _first_error(results) is None:
                continue
            # Some of the batch are already gone (or the writer is absent): one by one.
            for path in batch:
                try:
                    self._session.retry(self._zk.delete, path)
                except NoNodeError:
                    pass
                except NotEmptyError:
                    # Something was created under a deleted stream (a late writer znode):
                    # the next purge_deleted_leftovers() takes it.
                    log.warning("metadata.stream_leftover", stream_id=stream_id, path=path)

    def purge_deleted_leftovers(self) -> list[int]:
        """Returns the ids of stream directories it removed because they had no `meta` any
        more: what a `delete_stream` of a big stream leaves when it dies half-way. Creation
        makes the directory and its meta in one multi-op, so nothing live is touched."""
        purged = []
        for stream_id in self.stream_ids():
            if self._session.retry(self._zk.exists, paths.stream_meta(stream_id)) is None:
                self._purge_stream_dir(stream_id)
                purged.append(stream_id)
        return purged

    # ---------------------------------------------------------------- term-atomic CAS

    def _commit(self, ops: Iterable[_Op]) -> list[Any]:
        """Returns the per-op results of one multi-op (errors as exception instances). Raises
        kazoo's ConnectionLoss/OperationTimeoutError as they are, since only the caller knows
        how to settle an outcome that is now unknown, and `MetadataSessionExpiredError`."""
        txn = self._zk.transaction()
        for op in ops:
            op.add_to(txn)
        try:
            results = list(txn.commit())
        except SessionExpiredError as exc:
            raise MetadataSessionExpiredError(
                "ZooKeeper session expired; the change may have happened"
            ) from exc
        except ConnectionClosedError as exc:
            raise MetadataError("metadata session is closed") from exc
        for result in results:
            if isinstance(result, NoAuthError):
                raise permission_denied(result, self._session.auth) from result
        return results

    def _commit_meta(
        self,
        stream_id: int,
        expected_version: int,
        new_meta: StreamMeta,
        extra_ops: Sequence[_Op] = (),
        *,
        op_ids: Sequence[str],
        action: str,
    ) -> tuple[StreamMeta, int]:
        """Returns `(new_meta, new version)` after one multi-op that sets `meta` at
        `expected_version` and runs `extra_ops`; raises `BadVersionError` when the version
        moved. `op_ids` are those `meta` holds at `expected_version`: the write adds its own.

        After a connection loss it looks for its own op id in `meta` before retrying, because
        the multi-op may have landed with its reply lost; then other changes may have followed
        it (retention, a repair), and it returns the stream as it is now if they kept the term.
        Only this call's random op id counts as proof, never what `meta` looks like: another
        writer's change of the same shape must stay a conflict."""
        if len(extra_ops) + 1 > MAX_OPS_PER_MULTI:
            raise InvalidArgumentError(
                "too many changes for one multi-op", ops=len(extra_ops) + 1, max=MAX_OPS_PER_MULTI
            )
        op_id = secrets.token_hex(8)
        meta_path = paths.stream_meta(stream_id)
        written = new_meta.to_json((*op_ids, op_id)[-OP_IDS_KEPT:])
        ops = [_Op("set_data", meta_path, written, expected_version), *extra_ops]
        deadline = time.monotonic() + self._session.retry_deadline_s
        ambiguous = False
        context = {"stream": new_meta.name, "stream_id": stream_id, "action": action}

        def settle() -> tuple[StreamMeta, int] | None:
            """Returns the stored meta when our multi-op landed and the term it wrote still
            stands (same-term changes may have followed it); None when the version still waits
            for it; raises BadVersionError when someone else moved it (before or after ours: a
            newer term is the caller's to see)."""
            stored, version, stored_ops = self._read_meta(stream_id)
            if op_id in stored_ops and stored.term == new_meta.term:
                log.info(
                    "metadata.stream_changed",
                    version=version,
                    term=stored.term,
                    changes_after=version - expected_version - 1,
                    reply_lost=True,
                    **context,
                )
                return stored, version
            if version != expected_version:
                raise BadVersionError(
                    "stream metadata changed",
                    expected_version=expected_version,
                    current_version=version,
                    **context,
                )
            return None

        while True:
            if ambiguous and (done := settle()) is not None:
                return done
            try:
                results = self._commit(ops)
            except (ConnectionLoss, OperationTimeoutError) as exc:
                if time.monotonic() >= deadline:
                    raise MetadataError(
                        "ZooKeeper did not answer in time; the change may have happened",
                        **context,
                    ) from exc
                ambiguous = True
                continue
            except MetadataError as exc:
                raise type(exc)(exc.message, **{**exc.context, **context}) from exc
            failure = _first_error(results)
            if failure is None:
                version = results[0].version
                log.info("metadata.stream_changed", version=version, term=new_meta.term, **context)
                return new_meta, version
            index, error = failure
            if index == 0 and isinstance(error, KazooBadVersionError):
                if ambiguous and (done := settle()) is not None:
                    return done
                raise BadVersionError(
                    "stream metadata changed", expected_version=expected_version, **context
                )
            if index == 0 and isinstance(error, NoNodeError):
                raise StreamNotFoundError("stream not found", **context)
            raise MetadataError(
                "metadata multi-op failed",
                op=ops[index].kind,
                path=ops[index].path,
                error=type(error).__name__,
                **context,
            )

    def _check_fragment(self, meta: StreamMeta, fragment: Fragment) -> None:
        if not isinstance(fragment, Fragment):
            raise InvalidArgumentError("expected a Fragment", value=fragment)
        if len(fragment.ensemble) != meta.ensemble:
            raise InvalidArgumentError(
                "fragment ensemble has the wrong size",
                stream=meta.name,
                first_entry_id=fragment.first_entry_id,
                expected=meta.ensemble,
                actual=len(fragment.ensemble),
            )

    def _fragment_op(self, stream_id: int, fragment: Fragment, exists: bool) -> _Op:
        path = paths.stream_fragment(stream_id, fragment.first_entry_id)
        # The meta version check of the same multi-op guards these writes.
        return _Op("set_data" if exists else "create", path, fragment.to_json())

    def begin_takeover(
        self, stream_id: int, expected_version: int
    ) -> tuple[StreamMeta, int, Fragment | None]:
        """Returns `(meta, version, last fragment or None)` after moving the stream to a new
        term (`term + 1`) in state IN_RECOVERY, if `meta` was still at `expected_version`.
        The last fragment is the one the recovery must fence and read (as of that version).
        Raises `BadVersionError` (someone else moved first: reread) or `StreamSealedError`."""
        validate_stream_id(stream_id)
        meta, op_ids = self._read_meta_at(stream_id, expected_version, "begin_takeover")
        if meta.state is StreamState.SEALED:
            raise StreamSealedError("stream is sealed", stream=meta.name, stream_id=stream_id)
        # Read after seeing expected_version; the CAS below proves nothing moved since.
        fragments = self._read_fragments(stream_id)
        new_meta, version = self._commit_meta(
            stream_id,
            expected_version,
            meta.replace(term=meta.term + 1, state=StreamState.IN_RECOVERY),
            op_ids=op_ids,
            action="begin_takeover",
        )
        return new_meta, version, fragments[-1] if fragments else None

    def finish_recovery(
        self,
        stream_id: int,
        expected_version: int,
        term: int,
        fragments_changed: Sequence[Fragment],
        new_fragments: Sequence[Fragment],
        first_entry_id_of_term: int,
        producers: ProducerChange | None = None,
    ) -> tuple[StreamMeta, int]:
        """Returns `(meta, version)` after one multi-op that reopens the stream (OPEN), writes
        the fragments the recovery changed or created (each replaces the znode with its first
        id, or creates it) and appends `(term, first_entry_id_of_term)` to the term history.
        `producers` folds what the previous producer term wrote into the producer table and
        names the new term's producer; without it both stay as they were.
        Raises `BadVersionError`, `InvalidTermError` when `term` is not the stream's term, and
        `InvalidArgumentError` for fragments that do not fit the stream."""
        validate_stream_id(stream_id)
        meta, op_ids = self._read_meta_at(stream_id, expected_version, "finish_recovery")
        if meta.term != term:
            raise InvalidTermError(
                "another writer took over", term=term, current_term=meta.term, stream=meta.name
            )
        if meta.state is not StreamState.IN_RECOVERY:
            raise MetadataError(
                "stream is not in recovery", stream=meta.name, state=str(meta.state)
            )
        existing = self._fragment_ids(stream_id)
        fragments = [*fragments_changed, *new_fragments]
        firsts = [f.first_entry_id for f in fragments]
        if len(set(firsts)) != len(firsts):
            raise InvalidArgumentError("two fragments with one first id", first_entry_ids=firsts)
        for fragment in fragments:
            self._check_fragment(meta, fragment)
            # Recovery only touches the tail: the last fragment and what follows it.
            if existing and fragment.first_entry_id < existing[-1]:
                raise InvalidArgumentError(
                    "recovery may only change the last fragment and add later ones",
                    stream=meta.name,
                    first_entry_id=fragment.first_entry_id,
                    last_fragment_first_entry_id=existing[-1],
                )
        previous_first = meta.last_term_first_entry_id()
        if not isinstance(first_entry_id_of_term, int) or first_entry_id_of_term < (
            previous_first or 0
        ):
            raise InvalidArgumentError(
                "a term cannot start before the previous one",
                stream=meta.name,
                first_entry_id_of_term=first_entry_id_of_term,
                previous_term_first_entry_id=previous_first,
            )
        ids = set(existing)
        ops = [self._fragment_op(stream_id, f, f.first_entry_id in ids) for f in fragments]
        new_meta = meta.replace(
            state=StreamState.OPEN,
            term_history=compact_term_history(
                (*meta.term_history, (term, first_entry_id_of_term)), meta.first_entry_id
            ),
        )
        if producers is not None:
            new_meta = producers.apply(new_meta)
        return self._commit_meta(
            stream_id, expected_version, new_meta, ops, op_ids=op_ids, action="finish_recovery"
        )

    def record_accepted_loss(
        self, stream_id: int, expected_version: int, loss: AcceptedLoss
    ) -> tuple[StreamMeta, int]:
        """Returns `(meta, version)` after appending `loss` to the stream's accept-loss records
        (keeping the newest `MAX_ACCEPTED_LOSSES`), while the recovery of `loss.term` runs:
        durable before that recovery gives anything up. Raises `BadVersionError`,
        `InvalidTermError` when `loss.term` is not the stream's term, `MetadataError` when the
        stream is not in recovery."""
        validate_stream_id(stream_id)
        if not isinstance(loss, AcceptedLoss):
            raise InvalidArgumentError("expected an AcceptedLoss", value=loss)
        meta, op_ids = self._read_meta_at(stream_id, expected_version, "record_accepted_loss")
        if meta.term != loss.term:
            raise InvalidTermError(
                "another writer took over", term=loss.term, current_term=meta.term, stream=meta.name
            )
        if meta.state is not StreamState.IN_RECOVERY:
            raise MetadataError(
                "stream is not in recovery", stream=meta.name, state=str(meta.state)
            )
        losses = (*meta.accepted_losses, loss)[-MAX_ACCEPTED_LOSSES:]
        return self._commit_meta(
            stream_id,
            expected_version,
            meta.replace(accepted_losses=losses),
            op_ids=op_ids,
            action="record_accepted_loss",
        )

    def add_fragment(
        self,
        stream_id: int,
        expected_version: int,
        new_fragment: Fragment,
        replaces_first_id: bool,
    ) -> tuple[StreamMeta, int]:
        """Returns `(meta, version)` after an ensemble change: with `replaces_first_id` the
        fragment overwrites the existing one with the same first id (in any state, so that
        repairs can move closed fragments of SEALED streams too), else it is created after
        the last fragment (OPEN streams only). Bumps the meta version; raises
        `BadVersionError`."""
        validate_stream_id(stream_id)
        meta, op_ids = self._read_meta_at(stream_id, expected_version, "add_fragment")
        self._check_fragment(meta, new_fragment)
        existing = self._fragment_ids(stream_id)
        first = new_fragment.first_entry_id
        if replaces_first_id:
            if first not in existing:
                raise InvalidArgumentError(
                    "no fragment with this first id to replace",
                    stream=meta.name,
                    first_entry_id=first,
                )
        else:
            self._require_open(meta, stream_id)
            if (existing and first <= existing[-1]) or first < meta.first_entry_id:
                raise InvalidArgumentError(
                    "a new fragment must start after the last one and the first retained entry",
                    stream=meta.name,
                    first_entry_id=first,
                    last_fragment_first_entry_id=existing[-1] if existing else None,
                )
        op = self._fragment_op(stream_id, new_fragment, replaces_first_id)
        return self._commit_meta(
            stream_id, expected_version, meta, [op], op_ids=op_ids, action="add_fragment"
        )

    def roll_fragment(
        self,
        stream_id: int,
        expected_version: int,
        closed_fragment: Fragment,
        new_fragment: Fragment,
        producers: ProducerChange | None = None,
    ) -> tuple[StreamMeta, int]:
        """Returns `(meta, version)` after a capacity roll: `closed_fragment` (the last one,
        with `last_entry_id` and its totals) replaces its znode and `new_fragment`, starting
        at `last_entry_id + 1`, is created; `producers` folds what the term's producer wrote
        in the closed fragment into the producer table and moves its producer term to the new
        fragment. OPEN streams only; raises
        `BadVersionError`."""
        validate_stream_id(stream_id)
        meta, op_ids = self._read_meta_at(stream_id, expected_version, "roll_fragment")
        self._require_open(meta, stream_id)
        self._check_fragment(meta, closed_fragment)
        self._check_fragment(meta, new_fragment)
        existing = self._fragment_ids(stream_id)
        if not existing or closed_fragment.first_entry_id != existing[-1]:
            raise InvalidArgumentError(
                "only the last fragment can be rolled",
                stream=meta.name,
                first_entry_id=closed_fragment.first_entry_id,
                last_fragment_first_entry_id=existing[-1] if existing else None,
            )
        if closed_fragment.last_entry_id is None:
            raise InvalidArgumentError(
                "a rolled fragment needs its last_entry_id",
                stream=meta.name,
                first_entry_id=closed_fragment.first_entry_id,
            )
        if new_fragment.first_entry_id != closed_fragment.last_entry_id + 1:
            raise InvalidArgumentError(
                "the new fragment must start right after the closed one",
                stream=meta.name,
                last_entry_id=closed_fragment.last_entry_id,
                first_entry_id=new_fragment.first_entry_id,
            )
        ops = [
            self._fragment_op(stream_id, closed_fragment, exists=True),
            self._fragment_op(stream_id, new_fragment, exists=False),
        ]
        if producers is not None:
            meta = producers.apply(meta)
        return self._commit_meta(
            stream_id, expected_version, meta, ops, op_ids=op_ids, action="roll_fragment"
        )

    @staticmethod
    def _require_open(meta: StreamMeta, stream_id: int) -> None:
        if meta.state is StreamState.SEALED:
            raise StreamSealedError("stream is sealed", stream=meta.name, stream_id=stream_id)
        if meta.state is not StreamState.OPEN:
            raise MetadataError(
                "stream is not open", stream=meta.name, stream_id=stream_id, state=str(meta.state)
            )

    def set_state(
        self, stream_id: int, expected_version: int, state: StreamState | str
    ) -> tuple[StreamMeta, int]:
        """Returns `(meta, version)` after setting the stream's state (e.g. SEALED after a
        sealing recovery). A SEALED stream stays SEALED (`StreamSealedError`); IN_RECOVERY is
        refused (`InvalidArgumentError`): only `begin_takeover` enters it, with a new term."""
        validate_stream_id(stream_id)
        try:
            target = StreamState(state)
        except ValueError:
            raise InvalidArgumentError("unknown stream state", state=state) from None
        if target is StreamState.IN_RECOVERY:
            raise InvalidArgumentError("use begin_takeover to start a recovery", state=state)
        meta, op_ids = self._read_meta_at(stream_id, expected_version, "set_state")
        if meta.state is StreamState.SEALED and target is not StreamState.SEALED:
            raise StreamSealedError("stream is sealed", stream=meta.name, stream_id=stream_id)
        return self._commit_meta(
            stream_id,
            expected_version,
            meta.replace(state=target),
            op_ids=op_ids,
            action="set_state",
        )

    def set_retention(
        self, stream_id: int, retention: RetentionPolicy | None
    ) -> tuple[StreamMeta, int]:
        """Returns `(meta, version)` with the retention policy set (None: keep everything);
        rereads and retries on version conflicts, which retention never causes itself."""
        validate_stream_id(stream_id)
        if retention is not None and not isinstance(retention, RetentionPolicy):
            raise InvalidArgumentError("retention must be a RetentionPolicy or None")
        for _ in range(_CAS_ATTEMPTS):
            meta, version, op_ids = self._read_meta(stream_id)
            if meta.retention == retention:
                return meta, version
            try:
                return self._commit_meta(
                    stream_id,
                    version,
                    meta.replace(retention=retention),
                    op_ids=op_ids,
                    action="set_retention",
                )
            except BadVersionError:
                continue
        raise MetadataError("set_retention kept conflicting with others", stream_id=stream_id)

    def trim_fragments(
        self,
        stream_id: int,
        expected_version: int,
        fragment_first_ids_to_delete: Iterable[int],
        new_first_entry_id: int,
    ) -> tuple[StreamMeta, int]:
        """Returns `(meta, version)` after deleting the oldest fragments named and moving the
        first retained entry id to `new_first_entry_id`, in one multi-op. Refuses
        (`InvalidArgumentError`, nothing written) to delete the last fragment, a fragment that
        is not among the oldest, or to move `first_entry_id` backwards or below the first
        fragment kept."""
        validate_stream_id(stream_id)
        to_delete = sorted(set(fragment_first_ids_to_delete))
        meta, op_ids = self._read_meta_at(stream_id, expected_version, "trim_fragments")
        if not isinstance(new_first_entry_id, int) or new_first_entry_id < meta.first_entry_id:
            raise InvalidArgumentError(
                "first_entry_id never moves backwards",
                stream=meta.name,
                first_entry_id=meta.first_entry_id,
                new_first_entry_id=new_first_entry_id,
            )
        existing = self._fragment_ids(stream_id)
        if to_delete:
            if existing and existing[-1] in to_delete:
                raise InvalidArgumentError(
                    "the last fragment is never trimmed",
                    stream=meta.name,
                    first_entry_id=existing[-1],
                )
            if to_delete != existing[: len(to_delete)]:
                raise InvalidArgumentError(
                    "only the oldest fragments can be trimmed",
                    stream=meta.name,
                    to_delete=to_delete,
                    oldest=existing[: len(to_delete)],
                )
            kept_first = existing[len(to_delete)]
            if new_first_entry_id < kept_first:
                raise InvalidArgumentError(
                    "first_entry_id must reach the first fragment kept",
                    stream=meta.name,
                    new_first_entry_id=new_first_entry_id,
                    kept_first_entry_id=kept_first,
                )
        ops = [_Op("delete", paths.stream_fragment(stream_id, first)) for first in to_delete]
        return self._commit_meta(
            stream_id,
            expected_version,
            meta.replace(first_entry_id=new_first_entry_id),
            ops,
            op_ids=op_ids,
            action="trim_fragments",
        )

    # ---------------------------------------------------------------- writer ephemeral

    def register_writer(self, stream_id: int, info: WriterInfo) -> None:
        """Creates (or updates, when ours) the ephemeral `writer` znode naming `info`. A
        leftover writer znode of a lower term (its session has not timed out yet) is replaced;
        one of a higher term raises `InvalidTermError`."""
        validate_stream_id(stream_id)
        if not isinstance(info, WriterInfo):
            raise InvalidArgumentError("expected a WriterInfo", value=info)
        path = paths.stream_writer(stream_id)
        for _ in range(_WRITER_ATTEMPTS):
            try:
                self._session.retry(self._zk.create, path, info.to_json(), ephemeral=True)
                return
            except NodeExistsError:
                pass
            except NoNodeError:
                raise StreamNotFoundError("stream not found", stream_id=stream_id) from None
            try:
                data, stat = self._session.retry(self._zk.get, path)
            except NoNodeError:
                continue
            try:
                if stat.ephemeralOwner == self._session.session_id:
                    # Ours (possibly our own create whose reply was lost): update in place.
                    self._session.retry(self._zk.set, path, info.to_json(), stat.version)
                    return
                try:
                    current = WriterInfo.from_json(data)
                except MetadataError:
                    current = None
                if current is not None and current.term > info.term:
                    raise InvalidTermError(
                        "a writer of a newer term is registered",
                        term=info.term,
                        current_term=current.term,
                        stream_id=stream_id,
                    )
                if (
                    current is not None
                    and current.term == info.term
                    and current.writer_id != info.writer_id
                ):
                    raise MetadataError(
                        "another writer is registered with the same term",
                        stream_id=stream_id,
                        term=info.term,
                        writer=current.writer_id,
                    )
                log.info(
                    "metadata.writer_replaced",
                    stream_id=stream_id,
                    old_term=None if current is None else current.term,
                    term=info.term,
                )
                self._session.retry(self._zk.delete, path, stat.version)
            except (NoNodeError, KazooBadVersionError):
                continue
        raise MetadataError("writer registration kept conflicting", stream_id=stream_id)

    def unregister_writer(self, stream_id: int) -> None:
        """Deletes the `writer` znode when this session owns it; someone else's stays."""
        validate_stream_id(stream_id)
        path = paths.stream_writer(stream_id)
        try:
            _, stat = self._session.retry(self._zk.get, path)
            if stat.ephemeralOwner == self._session.session_id:
                self._session.retry(self._zk.delete, path, stat.version)
        except (NoNodeError, KazooBadVersionError):
            pass

    def get_writer(self, stream_id: int) -> WriterInfo | None:
        """Returns the registered writer, None when there is none (or it is unreadable)."""
        validate_stream_id(stream_id)
        try:
            data, _ = self._session.retry(self._zk.get, paths.stream_writer(stream_id))
        except NoNodeError:
            return None
        try:
            return WriterInfo.from_json(data)
        except MetadataError:
            log.warning("metadata.writer_malformed", stream_id=stream_id)
            return None

    def writer_alive(self, stream_id: int) -> bool:
        """Returns whether a writer's session holds the stream's `writer` znode."""
        validate_stream_id(stream_id)
        return self._session.retry(self._zk.exists, paths.stream_writer(stream_id)) is not None

    # ---------------------------------------------------------------- bookie view, watches

    def streams_with_bookie(self, bookie_id: str) -> list[tuple[StreamMeta, list[Fragment]]]:
        """Returns `(meta, all fragments)` of every non-SEALED stream with a fragment whose
        ensemble names `bookie_id` (BP-46 phase one and repairs), sorted by stream id."""
        validate_bookie_id(bookie_id)
        found = []
        for stream_id in self.stream_ids():
            try:
                meta, _, fragments = self.get_snapshot(stream_id)
            except StreamNotFoundError:
                continue  # deleted meanwhile, or a half-deleted leftover
            if meta.state is StreamState.SEALED:
                continue
            if any(bookie_id in f.ensemble for f in fragments):
                found.append((meta, fragments))
        return found

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
