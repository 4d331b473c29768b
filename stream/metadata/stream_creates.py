"""Creating and deleting streams: the id counter, the idempotent create, and deletes that
fit in one multi-op or fall back to batches."""

from __future__ import annotations

import time

from kazoo.exceptions import BadVersionError as KazooBadVersionError
from kazoo.exceptions import (
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
)

from stream.errors import (
    MetadataError,
    StreamExistsError,
    StreamNotFoundError,
)
from stream.logs import get_logger
from stream.metadata import paths
from stream.metadata.model import (
    MAX_STREAM_ID,
    RetentionPolicy,
    StreamMeta,
    validate_stream_name,
)
from stream.metadata.multiop import MAX_OPS_PER_MULTI, Op, first_error
from stream.metadata.stream_reads import StreamReads

log = get_logger(__name__)

# Bounds on the loops that reread and retry after losing a race to another client.
_CREATE_ATTEMPTS = 32
_DELETE_ATTEMPTS = 16


class StreamCreates(StreamReads):
    """Creates and deletes streams (with their fragment, cursor and writer znodes)."""

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
                Op("create", paths.stream_by_name(name), str(stream_id).encode()),
                Op("set_data", paths.STREAMS_NEXT_ID, str(stream_id + 1).encode(), counter_version),
                Op("create", paths.stream(stream_id)),
                Op("create", paths.stream_meta(stream_id), meta.to_json()),
                Op("create", paths.stream_fragments(stream_id)),
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
            failure = first_error(results)
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
            ops = [Op("delete", by_name, version=name_stat.version)]
            if meta_stat is not None:
                ops.append(Op("delete", paths.stream_meta(stream_id), version=meta_stat.version))
            whole = len(fragment_names) + len(cursors) + 5 <= MAX_OPS_PER_MULTI
            if whole:
                parent = paths.stream_fragments(stream_id)
                ops += [Op("delete", f"{parent}/{f}") for f in fragment_names]
                ops += [Op("delete", p) for p in cursors]
                if writer_stat is not None:
                    ops.append(
                        Op("delete", paths.stream_writer(stream_id), version=writer_stat.version)
                    )
                ops += [Op("delete", parent), Op("delete", paths.stream(stream_id))]
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
            failure = first_error(results)
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
            results = self._session.retry(self._commit, [Op("delete", p) for p in batch])
            if first_error(results) is None:
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
