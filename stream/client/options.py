"""Tunables of the writer, the recovery and the reader, and the protections the simulator may
switch off. Every bound the client keeps (windows, batches, timeouts, retries) is here."""

from __future__ import annotations

from dataclasses import dataclass, field

from stream.errors import InvalidArgumentError


@dataclass(frozen=True, slots=True)
class Protections:
    """The safety mechanisms of docs/design.md §5, all on by default. The simulator switches one off
    to show that its checker then finds the counterexample from the references; nothing else in
    the client reads these flags.

    - `term_fencing`: a takeover sends `Fence` with its new term to the last fragment's ensemble
      and waits for EC positives before reading. Off: it asks each bookie's LAC/LAFR with the
      term-less `StreamState` instead (recovery reads and writes still carry the term).
    - `truncate_noop`: recovery ends with the NOOP|TRUNCATE entry sent to every bookie of the
      last fragment. Off: no such entry; the new term starts right after the last recovered one.
    - `new_member_truncation`: a bookie joining a fragment it was not in just before first gets
      `Truncate(after = first_entry_id - 1)`. Off: no truncation.
    - `recovery_write_quorum`: recovery write-backs (and the no-op) count as done only once the
      WHOLE write set acked, failed bookies being replaced. Off: AQ acks are enough and a failed
      bookie is left out.
    - `spare_holders`: a replacement is never a bookie replaced away by a change the metadata
      does not hold yet: the stored fragment still counts its copies, and the new-member
      truncation would strip them. Off: any bookie outside the current ensemble.

    Two more keep the writer live (docs/design.md §10 progress) rather than safe:
    - `keep_failed_bookies`: a bookie whose add failed stays failed until it is replaced, also
      when an ensemble change replaces another one first. Off: that change reopens its link
      without resending what it missed (two bookies failing at once stall the writer).
    - `replace_unpinned_first`: of several failed bookies, one that is not pinned is replaced
      first. Off: ensemble order, waiting on a pinned one while an unpinned one could go.
    """

    term_fencing: bool = True
    truncate_noop: bool = True
    new_member_truncation: bool = True
    recovery_write_quorum: bool = True
    spare_holders: bool = True
    keep_failed_bookies: bool = True
    replace_unpinned_first: bool = True


ALL_PROTECTIONS = Protections()


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise InvalidArgumentError(f"{name} must be > 0", **{name: value})


@dataclass(frozen=True, slots=True)
class WriterOptions:
    """How a writer (and the recovery its takeover runs) behaves. Times in seconds."""

    # Entries appended but not yet acknowledged; a full window blocks `append_async`.
    window_entries: int = 8192
    # An idempotent producer unused this long is dropped from the stream's producer table
    # (docs/design.md §11; Kafka's default): its next writer starts it anew.
    producer_expiry_s: float = 7 * 86400.0
    # Payload bytes held by the pipeline until they reach their whole write set; with
    # `window_entries` this bounds the writer's memory (plus a few dozen bytes of framing per
    # entry).
    window_bytes: int = 64 << 20
    # Bound on one AddRequest: entries and bytes (bookies accept 64 MiB messages by default).
    batch_max_entries: int = 2048
    batch_max_bytes: int = 4 << 20
    # Batches in flight per bookie; more entries wait and join the next batch (adaptive batching:
    # one entry per batch when idle, large batches under load). A batch goes out beside one
    # already in flight only when `pipelined_batch_min_entries` wait: at moderate rates one
    # batch at a time coalesces everything that arrives during a round trip (measured on the
    # 2-core bench machine at 12k/s: p50 9 ms against 13-22 ms with four small batches in
    # flight, whose per-batch cost in gRPC and journal wake-ups saturated the CPU), while under
    # full load batches are large and several in flight keep every bookie busy.
    inflight_batches_per_bookie: int = 4
    pipelined_batch_min_entries: int = 256
    # A bookie that leaves a batch unanswered this long is failed and replaced.
    add_timeout_s: float = 10.0
    # After the LAC moves with no add to carry it, send it explicitly this soon (tailing readers
    # see the last entries within milliseconds).
    explicit_lac_delay_s: float = 0.002
    # Timeouts of the takeover's requests.
    fence_timeout_s: float = 5.0
    recovery_read_timeout_s: float = 5.0
    truncate_timeout_s: float = 5.0
    # Entries whose per-entry recovery reads are in flight at once, ahead of the scan.
    recovery_read_ahead: int = 64
    # A per-entry recovery read asks one bookie of the write set first (its positive decides
    # alone) and the others once it answered otherwise or after this long.
    recovery_read_hedge_s: float = 0.05
    # Bulk recovery reads (E == WQ): one ReadRange per chunk of at most this many entries or
    # about this many payload bytes (the next chunk is read while one is written back).
    recovery_range_entries: int = 4096
    recovery_range_bytes: int = 8 << 20
    # A takeover attempt that cannot decide (unknown answers) is retried after a backoff that
    # doubles from `retry_backoff_s` up to `retry_backoff_max_s`, until `takeover_deadline_s`.
    retry_backoff_s: float = 0.05
    retry_backoff_max_s: float = 2.0
    takeover_deadline_s: float = 60.0
    # An ensemble change waits this long for a replacement bookie (or for a pinned bookie's
    # entries to reach WQ) before the writer fails with NotEnoughBookiesError.
    ensemble_change_deadline_s: float = 5.0
    # Bounded retries of a metadata CAS that lost against a same-term change (retention).
    cas_attempts: int = 16
    protections: Protections = field(default=ALL_PROTECTIONS)

    def __post_init__(self) -> None:
        for name in (
            "window_entries",
            "window_bytes",
            "batch_max_entries",
            "batch_max_bytes",
            "inflight_batches_per_bookie",
            "pipelined_batch_min_entries",
            "recovery_read_ahead",
            "recovery_range_entries",
            "recovery_range_bytes",
            "cas_attempts",
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise InvalidArgumentError(f"{name} must be an int >= 1", **{name: value})
        for name in (
            "add_timeout_s",
            "explicit_lac_delay_s",
            "fence_timeout_s",
            "recovery_read_timeout_s",
            "recovery_read_hedge_s",
            "truncate_timeout_s",
            "retry_backoff_s",
            "retry_backoff_max_s",
            "takeover_deadline_s",
            "ensemble_change_deadline_s",
            "producer_expiry_s",
        ):
            _positive(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class ReaderOptions:
    """How a reader behaves. Times in seconds."""

    # A read unanswered this long is also sent to the next bookie of the write set.
    speculative_timeout_s: float = 0.2
    # A read (all bookies of the write set tried) gives up after this long.
    read_timeout_s: float = 10.0
    # Parallel single-entry reads (striped ensembles, where a bookie holds no long run).
    read_ahead: int = 128
    # ReadRange batches (catch-up on E == WQ ensembles).
    range_batch_bytes: int = 1 << 20
    range_max_entries: int = 65536
    # Longest single ReadLac long poll while tailing.
    lac_poll_ms: int = 10_000
    # A tail that finds no bookie answering backs off this long before trying again.
    retry_backoff_s: float = 0.1
    # Metadata unanswered this long: reads go on with the fragments already known (committed
    # entries stay where they were) while the metadata is re-read in the background.
    metadata_wait_s: float = 1.0

    def __post_init__(self) -> None:
        for name in (
            "speculative_timeout_s",
            "read_timeout_s",
            "retry_backoff_s",
            "metadata_wait_s",
        ):
            _positive(name, getattr(self, name))
        for name in ("read_ahead", "range_batch_bytes", "range_max_entries", "lac_poll_ms"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise InvalidArgumentError(f"{name} must be an int >= 1", **{name: value})
