"""The ZooKeeper layout of docs/design.md §3: every znode path, relative to the metadata root (the
session's chroot). Only this module spells paths; the rest call these functions."""

from __future__ import annotations

STREAMS = "/streams"
STREAMS_BY_NAME = "/streams/by-name"
# A CAS counter: the next stream id to hand out (decimal text). Ids are never reused, because
# bookies may still hold data of a deleted stream and key it by id.
STREAMS_NEXT_ID = "/streams/next-id"
BOOKIES = "/bookies"
BOOKIES_AVAILABLE = "/bookies/available"
BOOKIES_COOKIES = "/bookies/cookies"
UNDERREPLICATED = "/underreplicated"
# Auto-recovery (docs/design.md §7): one marker per under-replicated fragment, the workers'
# ephemeral locks on them, the auditor's election, and the bookies being drained (decommissioned).
UNDERREPLICATED_FRAGMENTS = "/underreplicated/fragments"
UNDERREPLICATED_LOCKS = "/underreplicated/locks"
AUDITOR_ELECTION = "/auditor/leader"
BOOKIES_DRAINING = "/bookies/draining"
INSTANCE_ID = "/instanceid"

# Persistent parents that `MetadataSession.connect` creates when missing.
BASE_LAYOUT = (
    STREAMS_BY_NAME,
    BOOKIES_AVAILABLE,
    BOOKIES_COOKIES,
    BOOKIES_DRAINING,
    UNDERREPLICATED_FRAGMENTS,
    UNDERREPLICATED_LOCKS,
)

# Fragment znode names are zero-padded so that ZooKeeper's lexical order is entry order.
FRAGMENT_NAME_DIGITS = 20


def stream_by_name(name: str) -> str:
    """Returns the znode holding the id of stream `name` (validated by the caller)."""
    return f"{STREAMS_BY_NAME}/{name}"


def stream(stream_id: int) -> str:
    """Returns the parent znode of everything about stream `stream_id`."""
    return f"{STREAMS}/{stream_id}"


def stream_meta(stream_id: int) -> str:
    """Returns the znode holding the stream's JSON `StreamMeta`, whose version guards every
    term-atomic change."""
    return f"{STREAMS}/{stream_id}/meta"


def stream_fragments(stream_id: int) -> str:
    """Returns the parent znode of the stream's fragment znodes."""
    return f"{STREAMS}/{stream_id}/fragments"


def fragment_name(first_entry_id: int) -> str:
    """Returns the znode name of the fragment starting at `first_entry_id`."""
    return f"{first_entry_id:0{FRAGMENT_NAME_DIGITS}d}"


def stream_fragment(stream_id: int, first_entry_id: int) -> str:
    """Returns the znode of the fragment of `stream_id` starting at `first_entry_id`."""
    return f"{STREAMS}/{stream_id}/fragments/{fragment_name(first_entry_id)}"


def stream_cursors(stream_id: int) -> str:
    """Returns the parent znode of the stream's durable cursors (made with the first one)."""
    return f"{STREAMS}/{stream_id}/cursors"


def stream_cursor(stream_id: int, name: str) -> str:
    """Returns the znode holding cursor `name` of `stream_id` (validated by the caller)."""
    return f"{STREAMS}/{stream_id}/cursors/{name}"


def stream_writer(stream_id: int) -> str:
    """Returns the ephemeral znode naming the stream's current writer."""
    return f"{STREAMS}/{stream_id}/writer"


def bookie_available(bookie_id: str) -> str:
    """Returns the ephemeral registration znode of `bookie_id`."""
    return f"{BOOKIES_AVAILABLE}/{bookie_id}"


def bookie_cookie(bookie_id: str) -> str:
    """Returns the cookie znode of `bookie_id`."""
    return f"{BOOKIES_COOKIES}/{bookie_id}"


def marker_name(stream_id: int, first_entry_id: int) -> str:
    """Returns the name of the under-replication marker of a fragment (and of its lock)."""
    return f"{stream_id}-{fragment_name(first_entry_id)}"


def underreplicated_marker(name: str) -> str:
    """Returns the marker znode `name` (see `marker_name`)."""
    return f"{UNDERREPLICATED_FRAGMENTS}/{name}"


def underreplicated_lock(name: str) -> str:
    """Returns the ephemeral lock znode of marker `name`."""
    return f"{UNDERREPLICATED_LOCKS}/{name}"


def bookie_draining(bookie_id: str) -> str:
    """Returns the znode that marks `bookie_id` as being drained."""
    return f"{BOOKIES_DRAINING}/{bookie_id}"
