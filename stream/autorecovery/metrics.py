"""Prometheus metrics of auto-recovery (served by the bookie's `metrics_listen` when it runs
in a bookie; a standalone `streamctl autorecovery run` keeps them in-process)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

FRAGMENTS_REPLICATED = Counter(
    "streamkeeper_autorecovery_fragments_replicated_total",
    "Fragments whose lost share this process's workers copied and committed",
)
ENTRIES_COPIED = Counter(
    "streamkeeper_autorecovery_entries_copied_total", "Entries copied by replication workers"
)
BYTES_COPIED = Counter(
    "streamkeeper_autorecovery_bytes_copied_total", "Payload bytes copied by replication workers"
)
MARKERS_WORKED = Counter(
    "streamkeeper_autorecovery_markers_worked_total",
    "Markers a worker took, by outcome (replicated, whole, gone, open, failed)",
    ["outcome"],
)
AUDITS = Counter("streamkeeper_autorecovery_audits_total", "Audit passes run as leader")
MARKED = Counter(
    "streamkeeper_autorecovery_marked_total", "Fragments marked under-replicated", ["reason"]
)
LOST_BOOKIES = Gauge(
    "streamkeeper_autorecovery_lost_bookies", "Bookies counted lost by the last audit (leader)"
)
TAKEOVERS = Counter(
    "streamkeeper_autorecovery_takeovers_total",
    "Idle streams taken over to close an open fragment naming a lost or draining bookie",
)
AUDITOR_LEADING = Gauge("streamkeeper_autorecovery_auditor_leading", "1 while this process audits")
