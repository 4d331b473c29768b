"""Tunables of the writer, the recovery and the reader, and the protections the simulator may
switch off. Every bound the client keeps (windows, batches, timeouts, retries) is here."""

from __future__ import annotations

from dataclasses import dataclass

from stream.settings import NON_NEGATIVE, POSITIVE, Settings, setting


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


@dataclass(frozen=True, slots=True)
class WriterOptions(Settings):
    """How a writer (and the recovery its takeover runs) behaves. Times in seconds."""

    window_entries: int = setting(
        8192,
        check=POSITIVE,
        doc="entries appended but not yet acknowledged; a full window blocks `append_async`",
    )
    # Kafka's default (docs/design.md §11).
    producer_expiry_s: float = setting(
        7 * 86400.0,
        unit="s",
        check=POSITIVE,
        doc="an idempotent producer unused this long is dropped from the stream's producer "
        "table: its next writer starts it anew",
    )
    # With `window_entries` this bounds the writer's memory (plus a few dozen bytes of framing
    # per entry).
    window_bytes: int = setting(
        64 << 20,
        unit="bytes",
        check=POSITIVE,
        doc="payload bytes held by the pipeline until they reach their whole write set",
    )
    # Bookies accept 64 MiB messages by default.
    batch_max_entries: int = setting(2048, check=POSITIVE, doc="entries of one AddRequest")
    batch_max_bytes: int = setting(
        4 << 20, unit="bytes", check=POSITIVE, doc="payload bytes of one AddRequest"
    )
    # Adaptive batching: one entry per batch when idle, large batches under load. A batch goes
    # out beside one already in flight only when `pipelined_batch_min_entries` wait, or once
    # `batch_linger_s` has passed since the bookie's previous batch: at moderate rates one
    # batch per linger coalesces everything that arrives meanwhile (measured on the 2-core
    # bench machine at 12k/s, before the linger: p50 9 ms against 13-22 ms with four small
    # batches in flight, whose per-batch cost in gRPC and journal wake-ups saturated the CPU),
    # and an answer slower than the linger does not hold the next batch back (its round trip
    # would add to that batch's own); under full load batches are large and several in flight
    # keep every bookie busy.
    inflight_batches_per_bookie: int = setting(
        4,
        check=POSITIVE,
        doc="batches in flight per bookie; more entries wait and join the next batch",
    )
    pipelined_batch_min_entries: int = setting(
        256,
        check=POSITIVE,
        doc="entries that must wait before a batch goes out beside one in flight (sooner "
        "once batch_linger_s has passed)",
    )
    # Fewer, larger batches: without a linger every answer sends whatever arrived meanwhile,
    # so the faster the answers (the more CPU is free) the smaller the batches, and their
    # per-batch cost (gRPC messages and thread wake-ups here, journal writes and syncs in the
    # bookies) grows to fill the CPU whatever the rate. Measured from the link's previous
    # batch, not from the first waiting entry as Kafka's linger.ms and Pulsar's
    # batchingMaxPublishDelay are: an append after a quiet spell goes at once. At 15k/s on the
    # 2-core bench machine (loaded), CPU per entry with 0 / 2 / 5 / 10 ms: 86 / 81 / 70 / 56 us
    # (docs/benchmarks.md); 5 ms adds at most 5 ms to an append's latency.
    batch_linger_s: float = setting(
        0.005,
        unit="s",
        check=NON_NEGATIVE,
        doc="a batch smaller than pipelined_batch_min_entries goes out no sooner than this "
        "after the bookie's previous batch (0: at once)",
    )
    add_timeout_s: float = setting(
        10.0,
        unit="s",
        check=POSITIVE,
        doc="a bookie that leaves a batch unanswered this long is failed and replaced",
    )
    # A framed TCP stream costs a fraction of gRPC's CPU per batch (stream.wire.frames): about
    # a fifth less CPU per entry at 15,000-20,000/s on the bench machine, and a shorter tail
    # (docs/benchmarks.md). A bookie without a data port is added to over gRPC.
    data_port: bool = setting(
        True,
        doc="send adds to a bookie's data port when its registration has one (false: over "
        "gRPC, as to a bookie without one); each writer's own (a writer opened without "
        "options has the client's, which also carry the explicit LACs of idle streams)",
    )
    # Tailing readers see the last entries within milliseconds.
    explicit_lac_delay_s: float = setting(
        0.002,
        unit="s",
        check=POSITIVE,
        doc="after the LAC moves with no add to carry it, it is sent explicitly this soon",
    )
    fence_timeout_s: float = setting(
        5.0, unit="s", check=POSITIVE, doc="timeout of a takeover's Fence requests"
    )
    recovery_read_timeout_s: float = setting(
        5.0, unit="s", check=POSITIVE, doc="timeout of a takeover's recovery reads"
    )
    truncate_timeout_s: float = setting(
        5.0, unit="s", check=POSITIVE, doc="timeout of a takeover's Truncate requests"
    )
    recovery_read_ahead: int = setting(
        64,
        check=POSITIVE,
        doc="entries whose per-entry recovery reads are in flight at once, ahead of the scan",
    )
    # Its positive decides alone.
    recovery_read_hedge_s: float = setting(
        0.05,
        unit="s",
        check=POSITIVE,
        doc="a per-entry recovery read asks one bookie of the write set first, and the others "
        "once it answered otherwise or after this long",
    )
    # Bulk recovery reads (E == WQ): the next chunk is read while one is written back.
    recovery_range_entries: int = setting(
        4096, check=POSITIVE, doc="entries of one bulk recovery ReadRange"
    )
    recovery_range_bytes: int = setting(
        8 << 20,
        unit="bytes",
        check=POSITIVE,
        doc="about this many payload bytes per bulk recovery ReadRange",
    )
    # A takeover attempt that cannot decide (unknown answers) is retried after a backoff that
    # doubles from `retry_backoff_s` up to `retry_backoff_max_s`, until `takeover_deadline_s`.
    retry_backoff_s: float = setting(
        0.05, unit="s", check=POSITIVE, doc="first backoff of an undecided takeover"
    )
    retry_backoff_max_s: float = setting(
        2.0, unit="s", check=POSITIVE, doc="longest backoff of an undecided takeover"
    )
    takeover_deadline_s: float = setting(
        60.0, unit="s", check=POSITIVE, doc="a takeover gives up after this long"
    )
    ensemble_change_deadline_s: float = setting(
        5.0,
        unit="s",
        check=POSITIVE,
        doc="an ensemble change waits this long for a replacement bookie (or for a pinned "
        "bookie's entries to reach WQ) before the writer fails with NotEnoughBookiesError",
    )
    cas_attempts: int = setting(
        16,
        check=POSITIVE,
        doc="retries of a metadata CAS that lost against a same-term change (retention)",
    )
    protections: Protections = setting(
        ALL_PROTECTIONS, doc="the safety mechanisms the simulator may switch off"
    )


@dataclass(frozen=True, slots=True)
class ReaderOptions(Settings):
    """How a reader behaves. Times in seconds (`lac_poll_ms`: milliseconds, as its name says)."""

    speculative_timeout_s: float = setting(
        0.2,
        unit="s",
        check=POSITIVE,
        doc="a read unanswered this long is also sent to the next bookie of the write set",
    )
    read_timeout_s: float = setting(
        10.0,
        unit="s",
        check=POSITIVE,
        doc="a read (all bookies of the write set tried) gives up after this long",
    )
    read_ahead: int = setting(
        128,
        check=POSITIVE,
        doc="parallel single-entry reads (striped ensembles, where a bookie holds no long run)",
    )
    range_batch_bytes: int = setting(
        1 << 20,
        unit="bytes",
        check=POSITIVE,
        doc="size of one ReadRange batch (catch-up on E == WQ ensembles)",
    )
    range_max_entries: int = setting(65536, check=POSITIVE, doc="entries of one ReadRange batch")
    range_first_entries: int = setting(
        1024,
        check=POSITIVE,
        doc="entries of a range read's first ReadRange request (at most range_max_entries): "
        "its first entries come after this many are read, not after a whole answer",
    )
    # Each answer is received straight into a buffer of its size, without gRPC's two copies
    # and its thread: a third less CPU per entry on the reader, a sixth on the bookie
    # (docs/benchmarks.md). A bookie without a data port, or older, is read over gRPC, and so
    # is every bookie over TLS, where gRPC's own TLS costs less per byte.
    data_port: bool = setting(
        True,
        doc="read ranges from a bookie's data port when its registration has one and the "
        "client does not use TLS (false: over gRPC, as from a bookie without one); each "
        "reader's own (a reader opened without options has the client's)",
    )
    lac_poll_ms: int = setting(
        10_000, unit="ms", check=POSITIVE, doc="longest single ReadLac long poll while tailing"
    )
    retry_backoff_s: float = setting(
        0.1,
        unit="s",
        check=POSITIVE,
        doc="a tail that finds no bookie answering backs off this long before trying again",
    )
    metadata_wait_s: float = setting(
        1.0,
        unit="s",
        check=POSITIVE,
        doc="metadata unanswered this long: reads go on with the fragments already known "
        "(committed entries stay where they were) while it is re-read in the background",
    )
