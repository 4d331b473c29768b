"""The metadata's values (docs/design.md §3) as frozen dataclasses with their JSON znode encoding
and their checks: `StreamMeta`, `Fragment`, `RetentionPolicy`, `WriterInfo`, plus name checks.

Construction validates (raising `InvalidArgumentError`); `from_json` turns anything malformed
read from ZooKeeper into `MetadataError` instead."""

from __future__ import annotations

import builtins
import dataclasses
import enum
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stream.errors import InvalidArgumentError, MetadataError
from stream.protocol.producers import (
    DEFAULT_PRODUCER_EXPIRY_MS,
    MAX_PRODUCER_ID_CHARS,
    MAX_PRODUCERS,
    ProducerPosition,
    fold_producers,
)
from stream.protocol.quorum import QuorumConfig

MAX_NAME_CHARS = 255
MAX_STREAM_ID = (1 << 63) - 1
_STREAM_NAME = re.compile(r"^[A-Za-z0-9._-]{1,255}$")
# Bookie ids are often "host:port" in BookKeeper deployments, so ':' is allowed here.
_BOOKIE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,255}$")


class StreamState(enum.StrEnum):
    """A stream's lifecycle state in its `meta` znode."""

    OPEN = "OPEN"  # a writer may append (after its recovery)
    IN_RECOVERY = "IN_RECOVERY"  # a new term is fixing the end of the previous one
    SEALED = "SEALED"  # closed for good: no writer, no takeover, ever again


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive_number(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def validate_stream_name(name: object) -> str:
    """Returns `name` when it is 1-255 chars of [A-Za-z0-9._-] and not "." or ".."; else raises
    `InvalidArgumentError` (the name becomes a znode name, so '/' must never get through)."""
    if not isinstance(name, str) or not _STREAM_NAME.match(name) or name in (".", ".."):
        raise InvalidArgumentError(
            "stream name must be 1-255 chars of [A-Za-z0-9._-], not '.' or '..'", stream=name
        )
    return name


def validate_bookie_id(bookie_id: object) -> str:
    """Returns `bookie_id` when it is 1-255 chars of [A-Za-z0-9._:-] and not "." or "..";
    else raises `InvalidArgumentError`."""
    if (
        not isinstance(bookie_id, str)
        or not _BOOKIE_ID.match(bookie_id)
        or bookie_id
        in (
            ".",
            "..",
        )
    ):
        raise InvalidArgumentError(
            "bookie id must be 1-255 chars of [A-Za-z0-9._:-], not '.' or '..'",
            bookie=bookie_id,
        )
    return bookie_id


def validate_stream_id(stream_id: object) -> int:
    """Returns `stream_id` when it is an int in [1, 2**63 - 1]; else raises
    `InvalidArgumentError`."""
    if not _is_int(stream_id) or not 1 <= stream_id <= MAX_STREAM_ID:  # type: ignore[operator]
        raise InvalidArgumentError(
            "stream id must be an int in [1, 2**63 - 1]", stream_id=stream_id
        )
    return stream_id  # type: ignore[return-value]


def _decode_object(data: builtins.bytes, what: str) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MetadataError(f"malformed {what}: not JSON") from exc
    if not isinstance(body, dict):
        raise MetadataError(f"malformed {what}: not a JSON object")
    return body


def _encode(body: dict[str, Any]) -> builtins.bytes:
    # Sorted, compact: equal values give equal bytes, so idempotency checks compare bytes.
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class RetentionPolicy:
    """What a stream keeps: fragments whose last entry is younger than `max_age_s`, and the
    newest fragments totalling at most `max_bytes`; None means no limit of that kind. With
    `keep_unconsumed`, the age limit spares fragments some durable cursor has not consumed
    yet; `max_bytes` still bounds them (past it the oldest go anyway)."""

    max_age_s: float | None = None
    max_bytes: int | None = None
    keep_unconsumed: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.keep_unconsumed, bool):
            raise InvalidArgumentError(
                "keep_unconsumed must be a bool", keep_unconsumed=self.keep_unconsumed
            )
        if self.max_age_s is not None and not _is_positive_number(self.max_age_s):
            raise InvalidArgumentError("max_age_s must be > 0 or None", max_age_s=self.max_age_s)
        if self.max_bytes is not None and not (_is_int(self.max_bytes) and self.max_bytes > 0):
            raise InvalidArgumentError(
                "max_bytes must be an int > 0 or None", max_bytes=self.max_bytes
            )

    def to_dict(self) -> dict[str, Any]:
        """Returns the JSON object form `{max_age_s, max_bytes[, keep_unconsumed]}` (the flag
        only when set: policies without it keep their bytes)."""
        body: dict[str, Any] = {"max_age_s": self.max_age_s, "max_bytes": self.max_bytes}
        if self.keep_unconsumed:
            body["keep_unconsumed"] = True
        return body

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> RetentionPolicy:
        """Returns the policy in `body` (the `to_dict` form)."""
        return cls(
            max_age_s=body.get("max_age_s"),
            max_bytes=body.get("max_bytes"),
            keep_unconsumed=body.get("keep_unconsumed", False),
        )


@dataclass(frozen=True)
class Fragment:
    """One fragment znode: entries from `first_entry_id` up to the next fragment's first id,
    striped over `ensemble` (bookie ids). A closed fragment (rolled on capacity) also has
    `last_entry_id`, `bytes` and its first/last entry timestamps."""

    first_entry_id: int
    ensemble: tuple[str, ...]
    created_ms: int = 0
    last_entry_id: int | None = None
    bytes: int | None = None
    first_timestamp_ms: int | None = None
    last_timestamp_ms: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.ensemble, list):
            object.__setattr__(self, "ensemble", tuple(self.ensemble))
        ctx = {"first_entry_id": self.first_entry_id}
        if not _is_int(self.first_entry_id) or self.first_entry_id < 0:
            raise InvalidArgumentError("fragment first_entry_id must be an int >= 0", **ctx)
        if not isinstance(self.ensemble, tuple) or not self.ensemble:
            raise InvalidArgumentError("fragment ensemble must be a non-empty list", **ctx)
        for bookie_id in self.ensemble:
            validate_bookie_id(bookie_id)
        if len(set(self.ensemble)) != len(self.ensemble):
            raise InvalidArgumentError(
                "fragment ensemble must not name a bookie twice", ensemble=self.ensemble, **ctx
            )
        if not _is_int(self.created_ms) or self.created_ms < 0:
            raise InvalidArgumentError("created_ms must be an int >= 0", **ctx)
        if self.last_entry_id is not None and not (
            _is_int(self.last_entry_id) and self.last_entry_id >= self.first_entry_id
        ):
            raise InvalidArgumentError(
                "last_entry_id must be an int >= first_entry_id",
                last_entry_id=self.last_entry_id,
                **ctx,
            )
        for name in ("bytes", "first_timestamp_ms", "last_timestamp_ms"):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and value >= 0):
                raise InvalidArgumentError(f"{name} must be an int >= 0 or None", **ctx)

    @property
    def closed(self) -> bool:
        """Returns whether the fragment was closed by a roll (its last entry is recorded)."""
        return self.last_entry_id is not None

    def to_json(self) -> builtins.bytes:
        """Returns the fragment znode's JSON; the closing fields only once set."""
        body: dict[str, Any] = {
            "first_entry_id": self.first_entry_id,
            "ensemble": list(self.ensemble),
            "created_ms": self.created_ms,
        }
        for name in ("last_entry_id", "bytes", "first_timestamp_ms", "last_timestamp_ms"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        return _encode(body)

    @classmethod
    def from_json(cls, data: builtins.bytes) -> Fragment:
        """Returns the fragment in a znode's `data`; raises `MetadataError` when malformed."""
        body = _decode_object(data, "fragment")
        try:
            ensemble = body["ensemble"]
            if not isinstance(ensemble, list):
                raise InvalidArgumentError("ensemble is not a list")
            return cls(
                first_entry_id=body["first_entry_id"],
                ensemble=tuple(ensemble),
                created_ms=body.get("created_ms", 0),
                last_entry_id=body.get("last_entry_id"),
                bytes=body.get("bytes"),
                first_timestamp_ms=body.get("first_timestamp_ms"),
                last_timestamp_ms=body.get("last_timestamp_ms"),
            )
        except (KeyError, InvalidArgumentError) as exc:
            raise MetadataError("malformed fragment", reason=str(exc)) from exc


# Accept-loss records kept in a stream's meta: the newest ones (the meta stays small).
MAX_ACCEPTED_LOSSES = 10
# Term history pairs a stream keeps: every takeover adds one (each `streamctl append`, each
# Spark micro-batch), and an unbounded list grew the meta znode until ZooKeeper ran out of
# memory. What reads the history needs only the newest pair (where the current term started)
# and, for a bookie's self-repair, the first term above its own: an older pair dropped makes
# that a later fixed end, which still holds every entry the bookie may have lost.
MAX_TERM_HISTORY = 16


def compact_term_history(
    history: Sequence[tuple[int, int]], first_retained: int
) -> tuple[tuple[int, int], ...]:
    """Returns `history` without the terms that lie wholly below `first_retained` (the next
    term starts at or below it) and at most the newest `MAX_TERM_HISTORY` pairs of the rest."""
    start = 0
    for i in range(1, len(history)):
        if history[i][1] <= first_retained:
            start = i
    return tuple(history[start:])[-MAX_TERM_HISTORY:]


@dataclass(frozen=True)
class AcceptedLoss:
    """One `recover --accept-loss` (docs/design.md §4): the recovery of `term` ended the previous
    term before `first_entry_id` although bookies in limbo (`limbo_bookies`) could not say that
    entry was absent. The entries from `first_entry_id` up to `last_entry_id` (a bound: what
    the previous writer could have acknowledged) were given up. `operator` ran it at `at_ms`."""

    term: int
    first_entry_id: int
    last_entry_id: int
    limbo_bookies: tuple[str, ...]
    operator: str
    at_ms: int

    def __post_init__(self) -> None:
        if isinstance(self.limbo_bookies, list):
            object.__setattr__(self, "limbo_bookies", tuple(self.limbo_bookies))
        for name in ("term", "first_entry_id", "last_entry_id", "at_ms"):
            value = getattr(self, name)
            if not (_is_int(value) and value >= 0):
                raise InvalidArgumentError(f"accepted loss {name} must be an int >= 0")
        if self.last_entry_id < self.first_entry_id:
            raise InvalidArgumentError(
                "accepted loss last_entry_id must be >= first_entry_id",
                first_entry_id=self.first_entry_id,
                last_entry_id=self.last_entry_id,
            )
        if not isinstance(self.limbo_bookies, tuple):
            raise InvalidArgumentError("accepted loss limbo_bookies must be a list")
        for bookie_id in self.limbo_bookies:
            validate_bookie_id(bookie_id)
        if not isinstance(self.operator, str) or not self.operator:
            raise InvalidArgumentError("accepted loss operator must be a non-empty str")

    def to_dict(self) -> dict[str, Any]:
        """Returns the JSON object form (the fields, bookies as a list)."""
        body = dataclasses.asdict(self)
        body["limbo_bookies"] = list(self.limbo_bookies)
        return body

    @classmethod
    def from_dict(cls, body: object) -> AcceptedLoss:
        """Returns the record in `body` (the `to_dict` form); raises `InvalidArgumentError`."""
        if not isinstance(body, dict):
            raise InvalidArgumentError("accepted loss is not an object")
        try:
            return cls(**{f.name: body[f.name] for f in dataclasses.fields(cls)})
        except (KeyError, TypeError) as exc:
            raise InvalidArgumentError("malformed accepted loss", reason=str(exc)) from exc


def validate_producer_id(producer_id: object) -> str:
    """Returns `producer_id` when it is a non-empty str of at most 255 chars; else raises
    `InvalidArgumentError`."""
    if (
        not isinstance(producer_id, str)
        or not producer_id
        or len(producer_id) > MAX_PRODUCER_ID_CHARS
    ):
        raise InvalidArgumentError(
            f"producer id must be a non-empty str of at most {MAX_PRODUCER_ID_CHARS} chars",
            producer_id=producer_id,
        )
    return producer_id


def producer_position_to_dict(position: ProducerPosition) -> dict[str, Any]:
    """Returns the JSON object form of one producer table record."""
    return dataclasses.asdict(position)


def producer_position_from_dict(body: object) -> ProducerPosition:
    """Returns the record in `body` (the `producer_position_to_dict` form), checked; raises
    `InvalidArgumentError`."""
    if not isinstance(body, dict):
        raise InvalidArgumentError("producer record is not an object")
    try:
        position = ProducerPosition(
            producer_id=validate_producer_id(body["producer_id"]),
            last_sequence=body["last_sequence"],
            last_entry_id=body["last_entry_id"],
            last_used_ms=body["last_used_ms"],
        )
    except KeyError as exc:
        raise InvalidArgumentError("malformed producer record", reason=str(exc)) from exc
    for name in ("last_sequence", "last_entry_id", "last_used_ms"):
        value = getattr(position, name)
        if not (_is_int(value) and value >= 0):
            raise InvalidArgumentError(f"producer record {name} must be an int >= 0")
    return position


@dataclass(frozen=True)
class ProducerTerm:
    """The producer that writes in `term`, from `first_entry_id` on (docs/design.md §12): a
    term has one writer, so its entries carry only their sequence and the producer id lives
    here. Kept for the newest term only, until the next takeover folds what it wrote into
    the producer table."""

    term: int
    producer_id: str
    first_entry_id: int

    def __post_init__(self) -> None:
        validate_producer_id(self.producer_id)
        for name in ("term", "first_entry_id"):
            value = getattr(self, name)
            if not (_is_int(value) and value >= 0):
                raise InvalidArgumentError(f"producer term {name} must be an int >= 0")

    def to_dict(self) -> dict[str, Any]:
        """Returns the JSON object form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, body: object) -> ProducerTerm:
        """Returns the producer term in `body`; raises `InvalidArgumentError`."""
        if not isinstance(body, dict):
            raise InvalidArgumentError("producer term is not an object")
        try:
            return cls(body["term"], body["producer_id"], body["first_entry_id"])
        except KeyError as exc:
            raise InvalidArgumentError("malformed producer term", reason=str(exc)) from exc


@dataclass(frozen=True)
class ProducerChange:
    """What a takeover's or a roll's metadata change records of producers: `positions` (what
    producers wrote in the part of the stream being closed) folded into the producer table at
    `now_ms`, dropping those unused for `expiry_ms`; `producer_term` replaces the stream's:
    for a takeover the new term's producer (or None), for a roll the same producer from the
    new fragment on (what a later takeover reads starts there)."""

    positions: tuple[ProducerPosition, ...] = ()
    now_ms: int = 0
    expiry_ms: int = DEFAULT_PRODUCER_EXPIRY_MS
    producer_term: ProducerTerm | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "positions", tuple(self.positions))
        for position in self.positions:
            producer_position_from_dict(producer_position_to_dict(position))
        if not (_is_int(self.now_ms) and self.now_ms >= 0):
            raise InvalidArgumentError("now_ms must be an int >= 0", now_ms=self.now_ms)
        if not (_is_int(self.expiry_ms) and self.expiry_ms > 0):
            raise InvalidArgumentError("producer expiry must be > 0 ms", expiry_ms=self.expiry_ms)
        if self.producer_term is not None and not isinstance(self.producer_term, ProducerTerm):
            raise InvalidArgumentError("producer_term must be a ProducerTerm or None")

    def apply(self, meta: StreamMeta) -> StreamMeta:
        """Returns `meta` with the positions folded in and `producer_term` in place of the
        previous one."""
        producers = fold_producers(meta.producers, self.positions, self.now_ms, self.expiry_ms)
        return meta.replace(producers=producers, producer_term=self.producer_term)


@dataclass(frozen=True)
class StreamMeta:
    """A stream's `meta` znode. `ensemble`, `write_quorum`, `ack_quorum` are E/WQ/AQ;
    `first_entry_id` is the first retained entry; `term_history` holds `(term, first entry id
    of that term)` in increasing term order, one pair per term that opened for writing, the
    newest `MAX_TERM_HISTORY` whose entries are retained (`compact_term_history`);
    `accepted_losses` the newest `MAX_ACCEPTED_LOSSES` accept-loss recoveries, oldest first;
    `producers` the producer table (each producer's last sequence in the closed part of the
    stream, at most `MAX_PRODUCERS`, by producer id) and `producer_term` the producer of the
    newest term, if its writer has one (docs/design.md §12)."""

    name: str
    id: int
    ensemble: int
    write_quorum: int
    ack_quorum: int
    fragment_max_entries: int
    fragment_max_bytes: int
    fragment_max_age_s: float | None = None
    retention: RetentionPolicy | None = None
    term: int = 0
    state: StreamState = StreamState.OPEN
    first_entry_id: int = 0
    term_history: tuple[tuple[int, int], ...] = ()
    created_ms: int = 0
    accepted_losses: tuple[AcceptedLoss, ...] = ()
    producers: tuple[ProducerPosition, ...] = ()
    producer_term: ProducerTerm | None = None
    # Derived, not stored: the checked quorum triple for the protocol code.
    quorum: QuorumConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_stream_name(self.name)
        validate_stream_id(self.id)
        object.__setattr__(
            self, "quorum", QuorumConfig(self.ensemble, self.write_quorum, self.ack_quorum)
        )
        ctx = {"stream": self.name}
        if isinstance(self.state, str) and not isinstance(self.state, StreamState):
            try:
                object.__setattr__(self, "state", StreamState(self.state))
            except ValueError as exc:
                raise InvalidArgumentError("unknown stream state", state=self.state, **ctx) from exc
        if not isinstance(self.state, StreamState):
            raise InvalidArgumentError("unknown stream state", state=self.state, **ctx)
        for name in ("fragment_max_entries", "fragment_max_bytes"):
            value = getattr(self, name)
            if not (_is_int(value) and value > 0):
                raise InvalidArgumentError(f"{name} must be an int > 0", value=value, **ctx)
        if self.fragment_max_age_s is not None and not _is_positive_number(self.fragment_max_age_s):
            raise InvalidArgumentError(
                "fragment_max_age_s must be > 0 or None", value=self.fragment_max_age_s, **ctx
            )
        if self.retention is not None and not isinstance(self.retention, RetentionPolicy):
            raise InvalidArgumentError(
                "retention must be a RetentionPolicy or None", value=self.retention, **ctx
            )
        for name in ("term", "first_entry_id", "created_ms"):
            value = getattr(self, name)
            if not (_is_int(value) and value >= 0):
                raise InvalidArgumentError(f"{name} must be an int >= 0", value=value, **ctx)
        try:
            history = tuple(tuple(pair) for pair in self.term_history)
        except TypeError as exc:
            raise InvalidArgumentError("term_history holds [term, first_entry_id] pairs") from exc
        object.__setattr__(self, "term_history", history)
        previous_term, previous_first = 0, 0
        for pair in history:
            if len(pair) != 2 or not all(_is_int(v) for v in pair):
                raise InvalidArgumentError("term_history holds [term, first_entry_id] pairs", **ctx)
            term, first = pair
            # Terms only grow, and a later term never starts before an earlier one.
            if term <= previous_term or first < previous_first or term > self.term:
                raise InvalidArgumentError(
                    "term_history must grow in term and first entry id, up to the current term",
                    term_history=history,
                    **ctx,
                )
            previous_term, previous_first = term, first
        losses = tuple(self.accepted_losses)
        if len(losses) > MAX_ACCEPTED_LOSSES or not all(
            isinstance(loss, AcceptedLoss) for loss in losses
        ):
            raise InvalidArgumentError(
                f"accepted_losses holds at most {MAX_ACCEPTED_LOSSES} AcceptedLoss records", **ctx
            )
        object.__setattr__(self, "accepted_losses", losses)
        producers = tuple(self.producers)
        ids = [p.producer_id for p in producers if isinstance(p, ProducerPosition)]
        if len(ids) != len(producers) or len(ids) > MAX_PRODUCERS or ids != sorted(set(ids)):
            raise InvalidArgumentError(
                f"producers holds at most {MAX_PRODUCERS} records, one per producer id, sorted",
                **ctx,
            )
        object.__setattr__(self, "producers", producers)
        if self.producer_term is not None and not isinstance(self.producer_term, ProducerTerm):
            raise InvalidArgumentError("producer_term must be a ProducerTerm or None", **ctx)

    def same_config(self, other: StreamMeta) -> bool:
        """Returns whether `other` was created with the same name and configuration (quorums,
        rolling and retention policy), whatever its term, state or fragments."""
        return self._config() == other._config()

    def _config(self) -> tuple[Any, ...]:
        return (
            self.name,
            self.ensemble,
            self.write_quorum,
            self.ack_quorum,
            self.fragment_max_entries,
            self.fragment_max_bytes,
            self.fragment_max_age_s,
            self.retention,
        )

    def last_term_first_entry_id(self) -> int | None:
        """Returns the first entry id of the newest term in `term_history`, None when empty."""
        return self.term_history[-1][1] if self.term_history else None

    def to_json(self, op_ids: Sequence[str] = ()) -> builtins.bytes:
        """Returns the meta znode's JSON. `op_ids` (oldest first) tag the write that stores it
        and the writes before it, so that a writer whose reply was lost can tell whether its
        own multi-op landed, even when other changes followed it."""
        body: dict[str, Any] = {
            "name": self.name,
            "id": self.id,
            "ensemble": self.ensemble,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "term": self.term,
            "state": str(self.state),
            "first_entry_id": self.first_entry_id,
            "fragment_max_entries": self.fragment_max_entries,
            "fragment_max_bytes": self.fragment_max_bytes,
            "fragment_max_age_s": self.fragment_max_age_s,
            "retention": None if self.retention is None else self.retention.to_dict(),
            "term_history": [list(pair) for pair in self.term_history],
            "created_ms": self.created_ms,
        }
        if self.accepted_losses:  # absent until the first one: older metas keep their bytes
            body["accepted_losses"] = [loss.to_dict() for loss in self.accepted_losses]
        if self.producers:  # likewise: streams without producers keep their bytes
            body["producers"] = [producer_position_to_dict(p) for p in self.producers]
        if self.producer_term is not None:
            body["producer_term"] = self.producer_term.to_dict()
        if op_ids:
            body["op_ids"] = list(op_ids)
        return _encode(body)

    @classmethod
    def from_json(cls, data: builtins.bytes) -> StreamMeta:
        """Returns the meta in a znode's `data`; raises `MetadataError` when malformed."""
        meta, _ = cls.from_json_with_ops(data)
        return meta

    @classmethod
    def from_json_with_ops(cls, data: builtins.bytes) -> tuple[StreamMeta, tuple[str, ...]]:
        """Returns the meta in `data` and the op ids of the writes that stored it and those
        before it (oldest first; a single `op_id` as older versions wrote it)."""
        body = _decode_object(data, "stream meta")
        try:
            retention = body.get("retention")
            if retention is not None and not isinstance(retention, dict):
                raise InvalidArgumentError("retention is not an object")
            history = body.get("term_history", [])
            if not isinstance(history, list) or not all(isinstance(p, list) for p in history):
                raise InvalidArgumentError("term_history is not a list of pairs")
            losses = body.get("accepted_losses", [])
            if not isinstance(losses, list):
                raise InvalidArgumentError("accepted_losses is not a list")
            producers = body.get("producers", [])
            if not isinstance(producers, list):
                raise InvalidArgumentError("producers is not a list")
            producer_term = body.get("producer_term")
            meta = cls(
                name=body["name"],
                id=body["id"],
                ensemble=body["ensemble"],
                write_quorum=body["write_quorum"],
                ack_quorum=body["ack_quorum"],
                fragment_max_entries=body["fragment_max_entries"],
                fragment_max_bytes=body["fragment_max_bytes"],
                fragment_max_age_s=body.get("fragment_max_age_s"),
                retention=None if retention is None else RetentionPolicy.from_dict(retention),
                term=body.get("term", 0),
                state=body.get("state", StreamState.OPEN),
                first_entry_id=body.get("first_entry_id", 0),
                term_history=tuple(tuple(p) for p in history),
                created_ms=body.get("created_ms", 0),
                accepted_losses=tuple(AcceptedLoss.from_dict(loss) for loss in losses),
                producers=tuple(producer_position_from_dict(p) for p in producers),
                producer_term=None
                if producer_term is None
                else ProducerTerm.from_dict(producer_term),
            )
        except (KeyError, InvalidArgumentError) as exc:
            raise MetadataError("malformed stream meta", reason=str(exc)) from exc
        op_ids = body.get("op_ids", [body.get("op_id")])
        if not isinstance(op_ids, list):
            op_ids = []
        return meta, tuple(op for op in op_ids if isinstance(op, str))

    def replace(self, **changes: Any) -> StreamMeta:
        """Returns a copy with `changes` applied (and checked)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class WriterInfo:
    """The ephemeral `writer` znode: who writes the stream now, for operators and liveness."""

    writer_id: str
    host: str
    pid: int
    term: int

    def __post_init__(self) -> None:
        if not isinstance(self.writer_id, str) or not self.writer_id:
            raise InvalidArgumentError(
                "writer_id must be a non-empty str", writer_id=self.writer_id
            )
        if not isinstance(self.host, str):
            raise InvalidArgumentError("host must be a str", host=self.host)
        if not (_is_int(self.pid) and self.pid >= 0):
            raise InvalidArgumentError("pid must be an int >= 0", pid=self.pid)
        if not (_is_int(self.term) and self.term >= 0):
            raise InvalidArgumentError("term must be an int >= 0", term=self.term)

    def to_json(self) -> builtins.bytes:
        """Returns the writer znode's JSON."""
        return _encode(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, data: builtins.bytes) -> WriterInfo:
        """Returns the writer in `data`; raises `MetadataError` when malformed."""
        body = _decode_object(data, "writer")
        try:
            return cls(
                writer_id=body["writer_id"], host=body["host"], pid=body["pid"], term=body["term"]
            )
        except (KeyError, InvalidArgumentError) as exc:
            raise MetadataError("malformed writer", reason=str(exc)) from exc
