"""The LMDB index: entry locations, stream states, the journal checkpoint and the
unclean-shutdown bit, in one environment with named databases.

Durability is carried by the journal and the flush protocol, so the environment skips the
meta-page sync on commit (`metasync=False`, which keeps LMDB consistent after a system crash)
and writes through a writable map; the flusher calls `sync()` once its checkpoint is committed.
Callers serialise write transactions with their own lock (`StreamStorage` holds one for the
index); reads may come from any thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

import lmdb

from stream.bookie.storage.codec import (
    CHECKPOINT,
    ENTRY_KEY,
    META_CHECKPOINT,
    META_UNCLEAN,
    STREAM_PREFIX,
)
from stream.bookie.storage.disk_port import OS_DISK, DiskPort
from stream.bookie.storage.journal import JournalPosition
from stream.errors import StorageError
from stream.logs import get_logger
from stream.protocol.invariant import invariant

log = get_logger(__name__)

# Sparse: the file only grows with the data. Room for about a billion entry locations.
DEFAULT_MAP_BYTES = 64 << 30
_PUT_SLICE = 2048
_pack_key = ENTRY_KEY.pack
_pack_stream = STREAM_PREFIX.pack


class Index:
    """One LMDB environment with the databases `entries`, `streams` and `meta`."""

    def __init__(
        self, path: Path, *, map_bytes: int = DEFAULT_MAP_BYTES, disk: DiskPort = OS_DISK
    ) -> None:
        self._path = path
        self._disk = disk
        self._map_bytes = map_bytes
        self._env: lmdb.Environment | None = None

    def open(self) -> None:
        """Opens (creating if needed) the environment."""
        try:
            self._env = self._disk.open_index_env(
                str(self._path),
                map_size=self._map_bytes,
                max_dbs=4,
                writemap=True,
                metasync=False,
                sync=True,
                readahead=False,
                max_spare_txns=2,
            )
        except (lmdb.Error, OSError) as e:
            raise StorageError(f"cannot open the LMDB index: {e}", path=str(self._path)) from e
        env = self._env
        self._entries = env.open_db(b"entries")
        self._streams = env.open_db(b"streams")
        self._meta = env.open_db(b"meta")

    def close(self) -> None:
        """Closes the environment (after `sync()` when the caller wants it durable)."""
        if self._env is not None:
            self._env.close()
            self._env = None

    @property
    def env(self) -> lmdb.Environment:  # or the simulator's store with the same API
        if self._env is None:
            raise StorageError("the index is closed", path=str(self._path))
        return self._env

    def sync(self) -> None:
        """Makes every committed transaction durable (data and meta pages)."""
        self.env.sync(True)

    # -- meta -----------------------------------------------------------------------------

    def unclean_bit(self) -> bool:
        """Returns whether the unclean-shutdown bit is set."""
        with self.env.begin(db=self._meta) as txn:
            return txn.get(META_UNCLEAN) is not None

    def set_unclean_bit(self, value: bool) -> None:
        """Sets or clears the unclean-shutdown bit, durably."""
        with self.env.begin(db=self._meta, write=True) as txn:
            if value:
                txn.put(META_UNCLEAN, b"\x01")
            else:
                txn.delete(META_UNCLEAN)
        self.sync()

    def checkpoint(self) -> JournalPosition:
        """Returns the journal checkpoint: replay starts there ((0, 0) when none)."""
        with self.env.begin(db=self._meta) as txn:
            raw = txn.get(META_CHECKPOINT)
        if raw is None:
            return JournalPosition(0, 0)
        return JournalPosition(*CHECKPOINT.unpack(raw))

    # -- stream states --------------------------------------------------------------------

    def load_states(self) -> dict[int, bytes]:
        """Returns every stored stream state (packed)."""
        with self.env.begin(db=self._streams) as txn:
            return {STREAM_PREFIX.unpack(k)[0]: bytes(v) for k, v in txn.cursor()}

    # -- entry locations ------------------------------------------------------------------

    def get(self, stream_id: int, entry_id: int) -> bytes | None:
        """Returns the location of the entry, or None."""
        with self.env.begin(db=self._entries) as txn:
            return txn.get(_pack_key(stream_id, entry_id))

    def locations(self, stream_id: int, first: int, last: int, limit: int) -> dict[int, bytes]:
        """Returns {entry_id: location} for up to `limit` stored entries in [first, last]."""
        found: dict[int, bytes] = {}
        prefix = _pack_stream(stream_id)
        end = _pack_key(stream_id, last)
        with self.env.begin(db=self._entries) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(_pack_key(stream_id, first)):
                return found
            for key, value in cursor:
                if key > end or key[:8] != prefix or len(found) >= limit:
                    break
                found[ENTRY_KEY.unpack(key)[1]] = value
        return found

    def consecutive(self, stream_id: int, first: int, count: int) -> list[bytes]:
        """Returns the locations of entries `first`, `first + 1`... (at most `count`), up to
        the first id not stored. The range reader's hot path: no Python step per entry, and
        no (key, value) tuple per entry for the GC. Keys are unique and sorted, so when the
        `n`-th value read from `first` on is entry `first + n - 1`'s, every id between is
        there: the values are walked once, and the keys only when the run has a gap."""
        with self.env.begin(db=self._entries) as txn:
            cursor = txn.cursor()
            start = _pack_key(stream_id, first)
            if count < 1 or not cursor.set_key(start):
                return []
            values = list(islice(cursor.iternext(keys=False, values=True), count))
            n = len(values)
            # The cursor stays on the last item read (unpositioned past the database's end).
            if cursor.key() == _pack_key(stream_id, first + n - 1):
                return values
            cursor.set_key(start)
            keys = list(islice(cursor.iternext(keys=True, values=False), n))
            if keys[-1] == _pack_key(stream_id, first + n - 1):
                return values  # the run reaches the database's end
            held, gone = 0, n - 1  # key `held` is entry first + held's; key `gone` is not
            while gone - held > 1:
                mid = (held + gone) // 2
                if keys[mid] == _pack_key(stream_id, first + mid):
                    held = mid
                else:
                    gone = mid
            return values[: held + 1]

    def max_entry_id(self, stream_id: int, at_most: int) -> int:
        """Returns the highest stored entry id of the stream that is <= `at_most`, or -1."""
        if at_most < 0:
            return -1
        prefix = _pack_stream(stream_id)
        with self.env.begin(db=self._entries) as txn:
            cursor = txn.cursor()
            if cursor.set_range(_pack_key(stream_id, at_most + 1)):
                if not cursor.prev():
                    return -1
            elif not cursor.last():
                return -1
            key = cursor.key()
            if key[:8] != prefix:
                return -1
            entry_id: int = ENTRY_KEY.unpack(key)[1]
            return entry_id

    def delete_range(self, stream_id: int, first: int, last: int, *, limit: int = 0) -> int:
        """Deletes the stored entries of the stream in [first, last] (at most `limit` when
        > 0); returns how many."""
        if last < first or last < 0:
            return 0
        first = max(first, 0)
        end = _pack_key(stream_id, last)
        deleted = 0
        with self.env.begin(db=self._entries, write=True) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(_pack_key(stream_id, first)):
                return 0
            while limit <= 0 or deleted < limit:
                key = cursor.key()  # b"" once the cursor ran past the last key
                if not key or key > end or not cursor.delete():
                    break
                deleted += 1
        return deleted

    def first_entry_id(self, stream_id: int) -> int:
        """Returns the lowest stored entry id of the stream, or -1."""
        prefix = _pack_stream(stream_id)
        with self.env.begin(db=self._entries) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(prefix + bytes(8)):
                return -1
            key = cursor.key()
            if key[:8] != prefix:
                return -1
            entry_id: int = ENTRY_KEY.unpack(key)[1]
            return entry_id

    def commit_flush(
        self,
        keys: list[bytes],
        locations: list[bytes],
        states: dict[int, bytes],
        checkpoint: JournalPosition | None,
    ) -> None:
        """Stores the locations of a flush, the stream states and the journal checkpoint in
        one transaction (not synced: call `sync()`)."""
        env = self.env
        with env.begin(write=True) as txn:
            if keys:
                invariant(len(keys) == len(locations), "one location per key")
                cursor = txn.cursor(db=self._entries)
                # Slices: one long putmulti would hold the GIL for its whole length.
                for start in range(0, len(keys), _PUT_SLICE):
                    end = start + _PUT_SLICE
                    cursor.putmulti(zip(keys[start:end], locations[start:end], strict=True))
            if states:
                stream_cursor = txn.cursor(db=self._streams)
                stream_cursor.putmulti(
                    (_pack_stream(stream_id), packed) for stream_id, packed in states.items()
                )
            if checkpoint is not None:
                txn.put(META_CHECKPOINT, CHECKPOINT.pack(*checkpoint), db=self._meta)

    def move_locations(self, moves: Iterable[tuple[bytes, bytes, bytes]]) -> int:
        """For each (key, old, new), points `key` at `new` when it still points at `old`
        (a newer write or a deletion wins); returns how many moved."""
        moved = 0
        with self.env.begin(db=self._entries, write=True) as txn:
            for key, old, new in moves:
                if txn.get(key) == old:
                    txn.put(key, new)
                    moved += 1
        return moved

    def scan(self, chunk: int) -> Iterator[list[tuple[bytes, bytes]]]:
        """Yields every (key, location) in key order, in lists of up to `chunk`, each read
        in its own short transaction (a long read would keep LMDB from reusing pages)."""
        start = b""
        skip_start = False
        while True:
            batch: list[tuple[bytes, bytes]] = []
            with self.env.begin(db=self._entries) as txn:
                cursor = txn.cursor()
                if not cursor.set_range(start):
                    return
                for key, value in cursor:
                    if skip_start and key == start:
                        continue
                    batch.append((key, value))
                    if len(batch) >= chunk:
                        break
            if not batch:
                return
            yield batch
            if len(batch) < chunk:
                return
            start, skip_start = batch[-1][0], True

    def disk_bytes(self) -> int:
        """Returns the bytes the index files occupy on disk (the map file is sparse)."""
        total = 0
        for name in ("data.mdb", "lock.mdb"):
            try:
                total += self._disk.allocated(self._path / name)
            except FileNotFoundError:
                pass
        return total

    def entry_count(self) -> int:
        """Returns the number of stored entry locations."""
        with self.env.begin(db=self._entries) as txn:
            return int(txn.stat(self._entries)["entries"])
