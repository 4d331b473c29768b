"""The term-bound changes of a stream: takeover, recovery, ensemble changes, rolls, state,
retention and trims, each one CAS of `meta` (stream.metadata.stream_cas)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from stream.errors import (
    BadVersionError,
    InvalidArgumentError,
    InvalidTermError,
    MetadataError,
    StreamSealedError,
)
from stream.metadata import paths
from stream.metadata.model import (
    MAX_ACCEPTED_LOSSES,
    AcceptedLoss,
    Fragment,
    ProducerChange,
    RetentionPolicy,
    StreamMeta,
    StreamState,
    compact_term_history,
    validate_stream_id,
)
from stream.metadata.multiop import Op
from stream.metadata.stream_cas import MetaCas

# Bounds on the loops that reread and retry after losing a race to another client.
_CAS_ATTEMPTS = 16


class StreamChanges(MetaCas):
    """Moves streams through terms, fragments and states; each change checks `meta`'s
    version, so a writer with a stale view fails with `BadVersionError`."""

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
        ops = [Op("delete", paths.stream_fragment(stream_id, first)) for first in to_delete]
        return self._commit_meta(
            stream_id,
            expected_version,
            meta.replace(first_entry_id=new_first_entry_id),
            ops,
            op_ids=op_ids,
            action="trim_fragments",
        )
