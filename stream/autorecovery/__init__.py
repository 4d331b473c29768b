"""Auto-recovery (docs/design.md §7): the auditor finds fragments that name lost or draining bookies
and marks them; replication workers copy the missing share to another bookie and CAS the
fragment's ensemble; the scrub checks that bookies hold what metadata says."""

from stream.autorecovery.settings import AutoRecoverySettings

__all__ = ["AutoRecoverySettings"]
