"""The pure, I/O-free protocol core: quorum math, response classification, recovery decisions,
term rules, placement and checksums. No asyncio, grpc, kazoo, clock or global randomness."""

from stream.protocol.acks import PendingAdds
from stream.protocol.checksum import ENTRY_HEADER, entry_checksum
from stream.protocol.codes import (
    TRANSPORT_ERROR,
    Code,
    EntryFlag,
    ResponseClass,
    classify,
    limbo_code,
)
from stream.protocol.coverage import cohort_covered, coverage_threshold, is_covered
from stream.protocol.ensemble_change import (
    EnsembleChange,
    next_to_replace,
    pinned_bookies,
    plan_ensemble_change,
)
from stream.protocol.fragments import (
    FragmentEnsemble,
    check_fragments,
    ensemble_for,
    fragment_index_for,
)
from stream.protocol.invariant import InvariantViolation, invariant
from stream.protocol.justified import overwrite_refusal, trim_refusal
from stream.protocol.placement import (
    DEFAULT_MAX_ENTRY_BYTES,
    BookieCandidate,
    choose_ensemble,
    choose_replacement,
    journal_required,
    max_entry_bytes,
)
from stream.protocol.quorum import MAX_ENSEMBLE_SIZE, QuorumConfig
from stream.protocol.recovery import (
    FenceOutcome,
    FenceTally,
    ReadOutcome,
    RecoveryReadTally,
    RecoveryScan,
    RecoveryStatus,
    limbo_blocked,
    read_outcome,
    recovery_waits_for,
    scan_recovery_reads,
)
from stream.protocol.terms import (
    TermDecision,
    must_justify_term,
    must_learn_term,
    term_decision,
    term_justified,
)
from stream.protocol.truncation import (
    TruncateDecision,
    stale_truncate_message,
    truncate_decision,
)

__all__ = [
    "ENTRY_HEADER",
    "MAX_ENSEMBLE_SIZE",
    "TRANSPORT_ERROR",
    "BookieCandidate",
    "Code",
    "EnsembleChange",
    "EntryFlag",
    "FenceOutcome",
    "FenceTally",
    "FragmentEnsemble",
    "InvariantViolation",
    "PendingAdds",
    "QuorumConfig",
    "ReadOutcome",
    "RecoveryReadTally",
    "RecoveryScan",
    "RecoveryStatus",
    "ResponseClass",
    "TermDecision",
    "TruncateDecision",
    "check_fragments",
    "choose_ensemble",
    "choose_replacement",
    "DEFAULT_MAX_ENTRY_BYTES",
    "max_entry_bytes",
    "classify",
    "cohort_covered",
    "coverage_threshold",
    "ensemble_for",
    "entry_checksum",
    "fragment_index_for",
    "invariant",
    "is_covered",
    "journal_required",
    "limbo_blocked",
    "limbo_code",
    "must_justify_term",
    "must_learn_term",
    "next_to_replace",
    "overwrite_refusal",
    "pinned_bookies",
    "plan_ensemble_change",
    "read_outcome",
    "recovery_waits_for",
    "scan_recovery_reads",
    "stale_truncate_message",
    "term_decision",
    "term_justified",
    "trim_refusal",
    "truncate_decision",
]
