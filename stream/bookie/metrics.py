"""Prometheus metrics of a bookie (served on `metrics_listen`)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric


class Tally:
    """A counter family kept as plain numbers by label values, read when scraped. For the
    counters of every request: a prometheus_client `Counter` takes a lock and checks its state
    on each increment (~0.7 us, four per Add batch), a dict slot ~0.1 us. Counted by one thread
    (the event loop); the scrape only reads."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = list(labelnames)
        self.counts: dict[tuple[str, ...], float] = {}
        registry.register(self)

    def inc(self, labels: tuple[str, ...] = (), amount: float = 1) -> None:
        """Adds `amount` to the count of `labels` (label values in `labelnames` order)."""
        counts = self.counts
        counts[labels] = counts.get(labels, 0) + amount

    def value(self, labels: tuple[str, ...] = ()) -> float:
        return self.counts.get(labels, 0)

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for labels, value in list(self.counts.items()):  # a C-level copy: no lock needed
            family.add_metric(list(labels), value)
        return [family]


class TallyHistogram:
    """A histogram kept as plain numbers, read when scraped, as `Tally`: for the journal's
    group commits, observed by the journal thread holding the GIL (a prometheus_client
    `Histogram.observe` takes ~2.4 us, a bucket slot ~0.3). Observed by one thread."""

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = [float(b) for b in buckets]
        self._les = [repr(b) for b in self._bounds] + ["+Inf"]  # as prometheus_client writes them
        self.counts = [0] * (len(self._bounds) + 1)  # per bucket, not cumulative; last: +Inf
        self.sum = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1  # buckets are "less or equal"
        self.sum += value

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self._name, self._documentation)

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        counts = list(self.counts)
        cumulative = [sum(counts[: i + 1]) for i in range(len(counts))]
        family = self._family()
        family.add_metric([], list(zip(self._les, cumulative, strict=True)), self.sum)
        return [family]


ADD_ENTRIES = Tally("streamkeeper_bookie_add_entries_total", "Entries added", ["code"])
ADD_BATCHES = Tally("streamkeeper_bookie_add_batches_total", "Add batches received")
READ_ENTRIES = Tally(
    "streamkeeper_bookie_read_entries_total", "Entries read (Read and ReadRange)", ["code"]
)
REQUESTS = Tally("streamkeeper_bookie_requests_total", "Requests by RPC and code", ["rpc", "code"])
JOURNAL_SYNC_SECONDS = TallyHistogram(
    "streamkeeper_bookie_journal_sync_seconds",
    "Latency of one journal group commit (write + fdatasync)",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
)
JOURNAL_GROUP_RECORDS = TallyHistogram(
    "streamkeeper_bookie_journal_group_records",
    "Records per journal group commit",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
)
BYTES_WRITTEN = Counter(
    "streamkeeper_bookie_bytes_written_total", "Bytes written to disk", ["kind"]
)  # kind: journal | entrylog | compaction
WRITE_CACHE_BYTES = Gauge("streamkeeper_bookie_write_cache_bytes", "Bytes held in the write cache")
FLUSH_SECONDS = Histogram(
    "streamkeeper_bookie_flush_seconds", "Duration of one write-cache flush to entry logs"
)
ENTRY_LOGS = Gauge("streamkeeper_bookie_entry_logs", "Entry-log files on disk")
GC_DELETED_LOGS = Counter("streamkeeper_bookie_gc_deleted_logs_total", "Entry logs deleted by GC")
COMPACTED_LOGS = Counter(
    "streamkeeper_bookie_compacted_logs_total", "Entry logs rewritten by compaction", ["kind"]
)
READ_ONLY = Gauge("streamkeeper_bookie_read_only", "1 while the bookie is read-only")
LIMBO_STREAMS = Gauge("streamkeeper_bookie_limbo_streams", "Streams in limbo on this bookie")
START_UNCLEAN = Gauge(
    "streamkeeper_bookie_start_unclean",
    "1 when this start found the unclean-shutdown bit set (the previous run crashed)",
)
START_REPLAYED_RECORDS = Gauge(
    "streamkeeper_bookie_start_replayed_records", "Journal records replayed into the index at start"
)
START_REPLAYED_ENTRIES = Gauge(
    "streamkeeper_bookie_start_replayed_entries", "Journal entries replayed into the index at start"
)
FREE_BYTES = Gauge("streamkeeper_bookie_free_bytes", "Least free space among the bookie's disks")
ADD_STREAMS = Gauge("streamkeeper_bookie_add_streams", "Open Add streams (writer connections)")
DATA_PORT_CONNECTIONS = Counter(
    "streamkeeper_bookie_data_port_connections",
    "Connections to the data port, by outcome: served (admitted as an Add stream or for range "
    "reads), refused "
    "(answered by a refusal frame) or dropped (no preamble, a failed TLS handshake)",
    ["outcome"],
)
# BP-46 data integrity: phase one at boot, phase two (limbo repair) in the background.
PHASE_ONE_STREAMS = Gauge(
    "streamkeeper_bookie_phase_one_streams",
    "Open streams naming this bookie that the last phase one term-fenced and put in limbo",
)
PHASE_ONE_SECONDS = Gauge(
    "streamkeeper_bookie_phase_one_seconds", "Duration of the last phase one (before serving)"
)
AUDIT_EVENTS = Counter(
    "streamkeeper_bookie_audit_events_total",
    "Audited requests (Fence, Truncate, Trim, recovery adds, refusals) by action and principal",
    ["action", "principal"],
)
REFUSED = Counter(
    "streamkeeper_bookie_refused_total",
    "Requests refused because metadata or the stored entries do not justify them, by RPC and "
    "reason",
    ["rpc", "reason"],
)  # reason: unjustified_term | unjustified_trim | overwrite | stream_deleted | metadata_unavailable
