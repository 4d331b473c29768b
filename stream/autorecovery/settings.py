"""Auto-recovery settings (docs/design.md §7), shared by the bookie's embedded auto-recovery
(`bookie.toml`) and `streamctl autorecovery run`."""

from __future__ import annotations

from dataclasses import dataclass

from stream.errors import InvalidArgumentError


@dataclass(frozen=True)
class AutoRecoverySettings:
    """Every delay and bound of the auditor, the workers and the scrub (milliseconds)."""

    # A bookie gone from /bookies/available this long is lost: its fragments get markers
    # (BookKeeper's lostBookieRecoveryDelay). A bookie back earlier costs nothing.
    lost_bookie_recovery_delay_ms: int = 30_000
    # The open last fragment of a stream with no live writer is closed by a takeover after
    # this long, so that it can be repaired (openLedgerRereplicationGracePeriod).
    open_stream_replication_delay_ms: int = 30_000
    # Full audit of every stream, for what the watches missed.
    audit_interval_ms: int = 600_000
    # Scrub: first and last entry of every bookie's share of every fixed fragment...
    scrub_interval_ms: int = 3_600_000
    # ...and every entry with its checksum, on this slower schedule (0 = never).
    scrub_full_interval_ms: int = 86_400_000
    # Replication workers in this process (0: auditor candidate only).
    replication_workers: int = 1
    # Copy throttle per worker, payload bytes per second (0 = unlimited).
    replication_rate_bytes: int = 0
    # Takeovers of idle streams per audit pass.
    max_takeovers_per_audit: int = 16
    # Each bookie request (reads, adds, truncations) of a copy or a scrub.
    bookie_timeout_ms: int = 10_000

    def __post_init__(self) -> None:
        for name in (
            "lost_bookie_recovery_delay_ms",
            "open_stream_replication_delay_ms",
            "scrub_full_interval_ms",
            "replication_workers",
            "replication_rate_bytes",
            "max_takeovers_per_audit",
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise InvalidArgumentError(f"{name} must be an int >= 0", **{name: value})
        for name in ("audit_interval_ms", "scrub_interval_ms", "bookie_timeout_ms"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise InvalidArgumentError(f"{name} must be an int > 0", **{name: value})
