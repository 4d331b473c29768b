"""A stream's ephemeral `writer` znode: who writes it now, at which term."""

from __future__ import annotations

from kazoo.exceptions import BadVersionError as KazooBadVersionError
from kazoo.exceptions import (
    NodeExistsError,
    NoNodeError,
)

from stream.errors import (
    InvalidArgumentError,
    InvalidTermError,
    MetadataError,
    StreamNotFoundError,
)
from stream.logs import get_logger
from stream.metadata import paths
from stream.metadata.model import (
    WriterInfo,
    validate_stream_id,
)
from stream.metadata.stream_reads import StreamReads

log = get_logger(__name__)

# Bound on the loops that reread and retry after losing a race to another writer.
_WRITER_ATTEMPTS = 8


class WriterRegistration(StreamReads):
    """Registers, reads and removes a stream's writer."""

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
