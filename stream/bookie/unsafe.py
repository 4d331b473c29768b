"""The test-only switches that turn bookie protections off, so that tests can show their checks
fail without them. Never set in production.

They are parameters (`UnsafeSkips`) of the parts they switch: the storage engine, the metadata
checks, phase one. A bookie process takes them only from its command line, the hidden
`streamctl bookie start --unsafe-test-only-skip NAME,...` (absent from `--help`, from bookie.toml
and from the environment, so that no copied config file or inherited variable can turn them
on), and logs `bookie.unsafe_switches_on` as a warning at every start that has any; the
simulator passes them directly.

- "phase_one" skips BP-46 phase one, "limbo" runs it without setting limbo (terms only),
  "phase_one_term" runs it without raising terms (limbo only),
  "wiped_term_check" does not learn forgotten terms from metadata;
- "metadata_term_check" takes terms metadata never handed out, "trim_check" takes trims beyond
  metadata's first retained entry, "overwrite_check" lets an add replace an entry at or below
  the LAC with other bytes;
- "add_term_check" serves adds of a term below the bookie's (the chaos runs show their checker
  catches the superseded writer that lets through), "term_check" serves every request
  whatever its term (no fencing at all: the simulator's `term-fencing` switch);
- "limbo_unknown" makes a stream in limbo answer NO_SUCH_ENTRY for an entry it lacks instead
  of UNKNOWN (the simulator shows its checker catches the lost entry that lets a recovery
  truncate);
- "journal_sync" acknowledges a journal group once written, before its fdatasync (the
  simulator shows a crash in the middle of the group commit then loses acknowledged data);
- "unsynced_term" answers a request of a stream's new term while the journal record of that
  term is not synced yet (another request raised it and waits): the simulator shows a crash
  then forgets a term the bookie served (`stream.sim.answered_terms`);
- "truncate_order" applies every Truncate of the stream's term, even a late one below the point
  the bookie already truncated at (which deletes what the term wrote since).
"""

from __future__ import annotations

from dataclasses import dataclass

from stream.errors import ConfigError

# The hidden option of `streamctl bookie start` that names the switches (comma-separated).
UNSAFE_SKIP_OPTION = "--unsafe-test-only-skip"

UNSAFE_SWITCHES = frozenset(
    {
        "phase_one",
        "phase_one_term",
        "limbo",
        "wiped_term_check",
        "metadata_term_check",
        "trim_check",
        "overwrite_check",
        "add_term_check",
        "term_check",
        "limbo_unknown",
        "truncate_order",
        "journal_sync",
        "unsynced_term",
    }
)


@dataclass(frozen=True)
class UnsafeSkips:
    """The protections turned off (none: production)."""

    names: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = sorted(self.names - UNSAFE_SWITCHES)
        if unknown:
            raise ConfigError(
                f"unknown unsafe switch(es) {', '.join(unknown)}: "
                f"known are {', '.join(sorted(UNSAFE_SWITCHES))}"
            )

    def __contains__(self, name: object) -> bool:
        return name in self.names


SAFE = UnsafeSkips()


def parse_unsafe_skips(text: str) -> UnsafeSkips:
    """Returns the switches named in `text` (the command-line option's comma-separated form);
    raises `ConfigError` for a name that is not a switch."""
    return UnsafeSkips(frozenset(p.strip() for p in text.split(",") if p.strip()))
