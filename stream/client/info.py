"""What `StreamClient.stream_info` returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from stream.metadata.lag import CursorLag
from stream.metadata.model import AcceptedLoss


@dataclass(frozen=True)
class FragmentInfo:
    """A fragment as `stream_info` shows it: `last_entry_id` is None for the open (last)
    fragment; `bytes` and the first and last entry timestamps are None when unknown (not
    closed by a roll)."""

    first_entry_id: int
    last_entry_id: int | None
    ensemble: list[str]
    bytes: int | None = None
    first_timestamp_ms: int | None = None
    last_timestamp_ms: int | None = None


@dataclass(frozen=True)
class BookieStatus:
    """A bookie of the stream's last fragment as `stream_info` shows it: `state` is
    "available", "read-only" or "down" (not registered); `limbo` whether it holds the stream
    in limbo (None: it did not answer)."""

    bookie_id: str
    state: str
    limbo: bool | None = None


@dataclass(frozen=True)
class StreamInfo:
    """What `stream_info` returns."""

    name: str
    stream_id: int
    term: int
    state: str
    lac: int
    first_entry_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    fragments: list[FragmentInfo]
    writer: str | None = None
    # (term, first entry id of that term), oldest first: where each takeover's term began.
    term_history: list[tuple[int, int]] = field(default_factory=list)
    # The newest accept-loss recoveries (`recover --accept-loss`), oldest first: who gave up
    # which entries, when.
    accepted_losses: list[AcceptedLoss] = field(default_factory=list)
    # The last fragment's bookies, and for a stream IN_RECOVERY what its takeover waits for.
    bookies: list[BookieStatus] = field(default_factory=list)
    waiting_for: str | None = None
    # Each durable cursor's lag behind the LAC, by cursor name.
    cursors: dict[str, CursorLag] = field(default_factory=dict)
