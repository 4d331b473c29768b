"""What the storage engine's requests return: a code (the wire's), the bookie's term, the
durability future to wait for before answering (None: nothing to wait for) and a message for
non-OK codes; and what `open` found while replaying the journal."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

from stream.wire import bookie_pb2 as pb


@dataclass(frozen=True, slots=True)
class AddOutcome:
    """The result of `add_batch`: one code per entry (same order; one code when the batch
    was empty), the bookie's term for the stream afterwards, the future to wait for before
    answering (None: nothing to wait for; batches of one group commit share the same future
    object), a message for non-OK codes, and the entry ids of the batch (so the caller need
    not walk the entries again)."""

    codes: list[pb.Code]
    bookie_term: int
    durable: Future[None] | None
    message: str = ""
    entry_ids: list[int] = field(default_factory=list)
    # Why an entry of the batch was refused for replacing an acknowledged one ("": none).
    refused_overwrite: str = ""


@dataclass(frozen=True, slots=True)
class FenceResult:
    """The result of `fence`: what the bookie knows of the stream's end."""

    code: pb.Code
    bookie_term: int
    lac: int
    lafr: int
    last_entry_id: int
    limbo: bool
    durable: Future[None] | None
    message: str = ""


@dataclass(frozen=True, slots=True)
class ReadResult:
    """The result of `read`: the entry when `code` is OK."""

    code: pb.Code
    entry: pb.Entry | None
    lac: int
    bookie_term: int
    first_entry_id: int
    durable: Future[None] | None
    message: str = ""


@dataclass(frozen=True, slots=True)
class TruncateOutcome:
    """The result of `truncate`."""

    code: pb.Code
    bookie_term: int
    durable: Future[None] | None
    message: str = ""


@dataclass(frozen=True, slots=True)
class TrimOutcome:
    """The result of `trim`: the stream's first retained entry afterwards."""

    code: pb.Code
    first_entry_id: int
    durable: Future[None] | None
    message: str = ""


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What `open` found: journal records and entries replayed, and whether the previous
    shutdown was unclean (the unclean-shutdown bit was still set)."""

    records_replayed: int
    entries_replayed: int
    unclean: bool
