"""The test-only switch that turns bookie protections off, so that the real-process tests can
show that their checks fail without them. Read by nothing else; never set it in production.

`STREAMKEEPER_UNSAFE_BP46_SKIP` is a comma-separated list of:
- "phase_one" skips BP-46 phase one, "limbo" runs it without setting limbo (terms only),
  "wiped_term_check" does not learn forgotten terms from metadata;
- "metadata_term_check" takes terms metadata never handed out, "trim_check" takes trims beyond
  metadata's first retained entry, "overwrite_check" lets an add replace an entry at or below
  the LAC with other bytes;
- "add_term_check" serves adds of a term below the bookie's (the chaos runs show their checker
  catches the superseded writer that lets through).
"""

from __future__ import annotations

import os

UNSAFE_SKIP_ENV = "STREAMKEEPER_UNSAFE_BP46_SKIP"


def unsafe_skip() -> set[str]:
    """Returns the protections the test-only switch turns off (empty in production)."""
    return {p.strip() for p in os.environ.get(UNSAFE_SKIP_ENV, "").split(",") if p.strip()}
