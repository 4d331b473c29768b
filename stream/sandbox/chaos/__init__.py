"""The chaos harness: a cluster whose every process has a host (network namespace) of its own,
a nemesis of real faults, workloads that record a history, and a checker over that history."""
