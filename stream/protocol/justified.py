"""What a bookie refuses because neither metadata nor its own data can justify it
(docs/design.md §4, "Requests metadata cannot justify"): an add that would replace an
acknowledged entry with other bytes, and a trim beyond metadata's first retained entry. Pure
decisions; the term check is `stream.protocol.terms.must_justify_term` / `term_justified`."""

from __future__ import annotations

from typing import Protocol

from stream.protocol.codes import EntryFlag

_TRUNCATE = int(EntryFlag.TRUNCATE)


class StoredEntry(Protocol):
    """The fields of an entry the overwrite rule compares (a `bookie_pb2.Entry` has them)."""

    entry_id: int
    flags: int
    timestamp_ms: int
    payload: bytes
    crc32c: int


def overwrite_refusal(stored: StoredEntry | None, new: StoredEntry, lac: int) -> str | None:
    """Return why a bookie whose LAC for the stream is `lac` must not store `new` over
    `stored` (the entry it holds at that id, None: none), or None when it may.

    Above the LAC nothing is decided: an earlier term's unacknowledged entry is overwritten
    by a recovery write-back. At or below it an entry is acknowledged and never changes:
    - the same entry again is allowed (a retried add or write-back);
    - an earlier term's NOOP|TRUNCATE written back as a plain NOOP (same timestamp, empty
      payload) is allowed: recovery sends it so, as the truncation already happened;
    - an entry the bookie does not hold is allowed (another bookie's share when E > WQ, or
      a re-replication copy);
    - a TRUNCATE entry is refused: it would delete the acknowledged entries above it;
    - anything else is refused (a forged entry with a valid checksum)."""
    entry_id = new.entry_id
    if entry_id > lac:
        return None
    if new.flags & _TRUNCATE:
        return (
            f"a truncate entry at {entry_id}, at or below the LAC {lac}, would delete "
            "acknowledged entries"
        )
    if stored is None or _same(stored, new):
        return None
    if stored.flags & _TRUNCATE and _same_as_plain_noop(stored, new):
        return None
    return f"entry {entry_id} is at or below the LAC {lac} and differs from the stored entry"


def _same(stored: StoredEntry, new: StoredEntry) -> bool:
    # The checksum first: it differs for almost every forgery and costs no byte comparison.
    return (
        stored.crc32c == new.crc32c
        and stored.flags == new.flags
        and stored.timestamp_ms == new.timestamp_ms
        and stored.payload == new.payload
    )


def _same_as_plain_noop(stored: StoredEntry, new: StoredEntry) -> bool:
    return (
        new.flags == stored.flags & ~_TRUNCATE
        and new.timestamp_ms == stored.timestamp_ms
        and new.payload == stored.payload
    )


def trim_refusal(before_entry_id: int, metadata_first_entry_id: int | None) -> str | None:
    """Return why a bookie must not trim a stream below `before_entry_id` when metadata's
    first retained entry for it is `metadata_first_entry_id` (None: metadata deleted the
    stream, so everything may go), or None when it may. Retention and `trim` move metadata's
    first entry (CAS) before they trim bookies, so a trim beyond it deletes data readers are
    still promised."""
    if metadata_first_entry_id is None or before_entry_id <= metadata_first_entry_id:
        return None
    return (
        f"Trim before {before_entry_id} goes beyond metadata's first retained entry "
        f"{metadata_first_entry_id}"
    )
