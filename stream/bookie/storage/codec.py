"""The on-disk formats of the bookie's storage, in one place: journal records, entry-log
records, LMDB keys and values. Changing any of these makes existing data unreadable."""

from __future__ import annotations

import struct

# -- journal --------------------------------------------------------------------------------
# A journal file starts with JOURNAL_FILE_HEADER (magic, file sequence number) and holds
# records `[u32 body_len][u32 crc][body]`, body = `[u8 type][payload]`. A zero body_len marks
# the end of written data (zeros a crash may leave after it).
# Files are recycled (a file behind the checkpoint is overwritten as a later one, not
# deleted), so what follows the last record may be an earlier file's records: the crc is
# crc32c(body) continued from journal_seed(seq), which such stale records fail.
# Version 3 files are written in whole blocks (with O_DIRECT where the filesystem has it): the
# header fills the first JOURNAL_BLOCK, and every group commit ends on a block boundary with a
# REC_PAD record, so no write covers part of a block. Version 2 files (unaligned, seeded crcs)
# and version 1 files (crc32c(body) alone, never recycled) are still replayed.
JOURNAL_MAGIC = b"SKJRNL03"
JOURNAL_MAGIC_V2 = b"SKJRNL02"
JOURNAL_MAGIC_V1 = b"SKJRNL01"
JOURNAL_FILE_HEADER = struct.Struct("<8sQ")
JOURNAL_BLOCK = 4096  # version 3: where records start, and what every group is a multiple of
JOURNAL_SEED = struct.Struct("<Q")  # seq, whose crc32c seeds the crc of the file's records
JOURNAL_RECORD_HEADER = struct.Struct("<II")  # body_len, crc
JOURNAL_RECORD_PREFIX = struct.Struct("<IIB")  # body_len, crc, type (body's 1st byte)

REC_ADD = 1  # payload: an AddRequest serialized (only the entries that were stored)
REC_TERM = 2  # payload: TERM_BODY
REC_TRUNCATE = 3  # payload: TRUNCATE_BODY
REC_TRIM = 4  # payload: TRIM_BODY
REC_LIMBO = 5  # payload: LIMBO_BODY
RECORD_TYPES = frozenset({REC_ADD, REC_TERM, REC_TRUNCATE, REC_TRIM, REC_LIMBO})
REC_PAD = 6  # payload: zeros up to the next block boundary (version 3); never replayed

TERM_BODY = struct.Struct("<QQ")  # stream_id, term
TRUNCATE_BODY = struct.Struct("<QQq")  # stream_id, term, after_entry_id
TRIM_BODY = struct.Struct("<Qq")  # stream_id, before_entry_id
LIMBO_BODY = struct.Struct("<QBQ")  # stream_id, limbo (0/1), term (0: leave the term alone)

# -- entry logs -----------------------------------------------------------------------------
# An entry log starts with ENTRY_LOG_FILE_HEADER (magic, log id) and holds records
# `[u32 len][u64 stream_id][Entry serialized]` where len is the serialized entry's length.
ENTRY_LOG_MAGIC = b"SKELOG01"
ENTRY_LOG_FILE_HEADER = struct.Struct("<8sQ")
ENTRY_RECORD_HEADER = struct.Struct("<IQ")  # entry length, stream_id
ENTRY_RECORD_HEADER_BYTES = ENTRY_RECORD_HEADER.size

# -- LMDB index -----------------------------------------------------------------------------
# Entry locations: big-endian keys so that LMDB's byte order is (stream, entry) order.
# The value locates the serialized Entry (not the record header before it).
ENTRY_KEY = struct.Struct(">QQ")  # stream_id, entry_id
STREAM_PREFIX = struct.Struct(">Q")  # stream_id: the first 8 bytes of its entry keys
LOCATION = struct.Struct("<IQI")  # log_id, offset of the serialized Entry, its length
LOCATION_BYTES = LOCATION.size

# Stream states: key STREAM_PREFIX, value STREAM_STATE.
STREAM_STATE = struct.Struct("<QBqqqq")  # term, limbo, lac, lafr, last_entry_id, first_entry_id
# The same followed by the last Truncate applied (term, after_entry_id): states written before
# it was kept are STREAM_STATE alone and read as "none applied".
STREAM_STATE_TRUNCATED = struct.Struct("<QBqqqqQq")

# Meta keys.
META_CHECKPOINT = b"journal_checkpoint"  # value CHECKPOINT
META_UNCLEAN = b"unclean_shutdown"  # present while the bookie runs; absent after a clean close
CHECKPOINT = struct.Struct("<QQ")  # journal file sequence number, offset in that file


def journal_file_name(seq: int) -> str:
    """Returns the file name of journal file number `seq`."""
    return f"journal-{seq:016x}.log"


def recycled_journal_name(seq: int) -> str:
    """Returns the name a journal file behind the checkpoint takes while it waits to be
    reused (`seq` is its old number); replay never looks at it."""
    return f"recycle-{seq:016x}.log"


def entry_log_file_name(log_id: int) -> str:
    """Returns the file name of entry log `log_id`."""
    return f"entrylog-{log_id:08x}.log"


def parse_numbered_name(name: str, prefix: str, digits: int) -> int | None:
    """Returns the number in `name` when it is `<prefix><hex digits>.log`, else None."""
    if not (name.startswith(prefix) and name.endswith(".log")):
        return None
    hex_part = name[len(prefix) : -4]
    if len(hex_part) != digits:
        return None
    try:
        return int(hex_part, 16)
    except ValueError:
        return None
