"""Auto-recovery settings (docs/design.md §7), shared by the bookie's embedded auto-recovery
(`bookie.toml`) and `streamctl autorecovery run`."""

from __future__ import annotations

from dataclasses import dataclass

from stream.settings import NON_NEGATIVE, POSITIVE, Settings, setting


@dataclass(frozen=True)
class AutoRecoverySettings(Settings):
    """Every delay and bound of the auditor, the workers and the scrub (milliseconds)."""

    # A bookie back before the delay costs nothing (BookKeeper's lostBookieRecoveryDelay).
    lost_bookie_recovery_delay_ms: int = setting(
        30_000,
        unit="ms",
        check=NON_NEGATIVE,
        doc="a bookie missing from the registry this long is lost: its fragments are marked "
        "under-replicated",
    )
    # So that it can be repaired (openLedgerRereplicationGracePeriod).
    open_stream_replication_delay_ms: int = setting(
        30_000,
        unit="ms",
        check=NON_NEGATIVE,
        doc="grace before an idle stream's open last fragment naming a lost bookie is closed "
        "by a takeover",
    )
    audit_interval_ms: int = setting(
        600_000,
        unit="ms",
        check=POSITIVE,
        doc="full audit of every stream (what the watches missed)",
    )
    scrub_interval_ms: int = setting(
        3_600_000,
        unit="ms",
        check=POSITIVE,
        doc="scrub: first and last entry of every bookie's share of every closed fragment",
    )
    scrub_full_interval_ms: int = setting(
        86_400_000,
        unit="ms",
        check=NON_NEGATIVE,
        doc="scrub reading every entry with its checksum (0 = never)",
    )
    replication_workers: int = setting(
        1,
        check=NON_NEGATIVE,
        doc="replication workers in this process (0: auditor candidate only)",
    )
    replication_rate_bytes: int = setting(
        0,
        unit="bytes/s",
        check=NON_NEGATIVE,
        doc="copy throttle per worker, bytes/s (0 = unlimited)",
    )
    max_takeovers_per_audit: int = setting(
        16,
        check=NON_NEGATIVE,
        doc="takeovers of idle streams one audit pass may run",
    )
    # Reads, adds and truncations.
    bookie_timeout_ms: int = setting(
        10_000,
        unit="ms",
        check=POSITIVE,
        doc="timeout of each bookie request of a copy or a scrub",
    )
