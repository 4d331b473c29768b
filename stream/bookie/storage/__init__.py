"""The bookie's local storage engine (BookKeeper's DbLedgerStorage in Python): journal with
group commit, double-buffered write cache, entry logs, LMDB index, GC and compaction.
`StreamStorage` is the facade the gRPC service uses."""

from stream.bookie.storage.gc import CompactionReport, GcReport
from stream.bookie.storage.outcomes import (
    AddOutcome,
    FenceResult,
    ReadResult,
    ReplayReport,
    TrimOutcome,
    TruncateOutcome,
)
from stream.bookie.storage.state import StreamStateView
from stream.bookie.storage.storage import StreamStorage

__all__ = [
    "AddOutcome",
    "CompactionReport",
    "FenceResult",
    "GcReport",
    "ReadResult",
    "ReplayReport",
    "StreamStateView",
    "StreamStorage",
    "TrimOutcome",
    "TruncateOutcome",
]
