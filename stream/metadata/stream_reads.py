"""Reading streams from ZooKeeper (docs/design.md §3): meta, fragments, names and ids, each
read consistent as of one meta version. The base of `StreamStore`'s other jobs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from kazoo.exceptions import (
    ConnectionClosedError,
    NoAuthError,
    NoNodeError,
    SessionExpiredError,
)

from stream.errors import (
    BadVersionError,
    InvalidArgumentError,
    MetadataError,
    StreamNotFoundError,
)
from stream.logs import get_logger
from stream.metadata import paths
from stream.metadata.connection import (
    MetadataSession,
    MetadataSessionExpiredError,
    permission_denied,
)
from stream.metadata.model import (
    Fragment,
    StreamMeta,
    StreamState,
    validate_bookie_id,
    validate_stream_id,
    validate_stream_name,
)
from stream.metadata.multiop import Op

log = get_logger(__name__)

_SNAPSHOT_ATTEMPTS = 16


class StreamReads:
    """The reads of the streams under the session's metadata root. Thread-safe (kazoo clients
    are); every method may raise `MetadataError` when ZooKeeper does not answer within the
    session's retry deadline."""

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

    def _commit(self, ops: Iterable[Op]) -> list[Any]:
        """Returns the per-op results of one multi-op (errors as exception instances). Raises
        kazoo's ConnectionLoss/OperationTimeoutError as they are, since only the caller knows
        how to settle an outcome that is now unknown, and `MetadataSessionExpiredError`.
        In the base class because every job writes through it (and a test swaps it on one
        store to lose a reply)."""
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
