"""The term-bound compare-and-set of a stream's `meta` (docs/design.md §3): one multi-op that
sets `meta` at the version its caller read, settling a lost reply by the op id it wrote."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence

from kazoo.exceptions import BadVersionError as KazooBadVersionError
from kazoo.exceptions import (
    ConnectionLoss,
    NoNodeError,
    OperationTimeoutError,
)

from stream.errors import (
    BadVersionError,
    InvalidArgumentError,
    MetadataError,
    StreamNotFoundError,
)
from stream.logs import get_logger
from stream.metadata import paths
from stream.metadata.model import (
    Fragment,
    StreamMeta,
)
from stream.metadata.multiop import MAX_OPS_PER_MULTI, Op, first_error
from stream.metadata.stream_reads import StreamReads

log = get_logger(__name__)

# How many of its last writes `meta` names by op id. A client whose reply was lost finds its
# own op among them however many same-term changes (trims, repairs: a few per minute at most)
# followed it before it could look; past that many it reports a version conflict.
OP_IDS_KEPT = 16


class MetaCas(StreamReads):
    """The CAS every term-bound change of a stream goes through."""

    def _commit_meta(
        self,
        stream_id: int,
        expected_version: int,
        new_meta: StreamMeta,
        extra_ops: Sequence[Op] = (),
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
        ops = [Op("set_data", meta_path, written, expected_version), *extra_ops]
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
            failure = first_error(results)
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

    def _fragment_op(self, stream_id: int, fragment: Fragment, exists: bool) -> Op:
        path = paths.stream_fragment(stream_id, fragment.first_entry_id)
        # The meta version check of the same multi-op guards these writes.
        return Op("set_data" if exists else "create", path, fragment.to_json())
