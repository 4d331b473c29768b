"""The simulated disk's key-value store: the part of LMDB's API that the bookie's index uses
(named databases, read and write transactions, cursors), in memory, with LMDB's durability
as the index configures it: a committed write transaction is durable after `sync()`; a crash
keeps the synced state plus, seeded, a prefix of the transactions committed since.
"""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from sortedcontainers import SortedDict

from stream.errors import StorageError

# One change of a committed transaction: (database, key, value or None for a deletion).
_Change = tuple[bytes | None, bytes, bytes | None]


class SimStore:
    """An `lmdb.Environment` look-alike."""

    def __init__(self, guard: AbstractContextManager[None], on_sync: Callable[[], None]) -> None:
        """`guard` is held around every transaction and sync (the disk's lock; it fails
        them after a power cut) and `on_sync` is called at each sync."""
        self._lock = guard
        self._dbs: dict[bytes | None, SortedDict[bytes, bytes]] = {None: SortedDict()}
        self._durable: dict[bytes | None, dict[bytes, bytes]] = {None: {}}
        self._unsynced: list[list[_Change]] = []
        self._open = True
        self._on_sync = on_sync
        self.full = False  # write transactions fail with ENOSPC at commit

    def reopen(self) -> None:
        self._open = True

    def open_db(self, name: bytes) -> bytes:
        with self._lock:
            self._dbs.setdefault(name, SortedDict())
            self._durable.setdefault(name, {})
            return name

    def begin(self, db: bytes | None = None, write: bool = False) -> SimTxn:
        if not self._open:
            raise StorageError("the simulated index store is closed")
        return SimTxn(self, db, write)

    def sync(self, force: bool = False) -> None:
        with self._lock:
            self._on_sync()
            for changes in self._unsynced:
                self._apply(self._durable, changes)
            self._unsynced = []

    def close(self) -> None:
        self._open = False

    def crash(self, rng: random.Random | None) -> None:
        """Keeps the synced state and, with `rng`, a seeded prefix of the later commits
        (called holding the disk's lock)."""
        kept = rng.randint(0, len(self._unsynced)) if rng is not None else 0
        for changes in self._unsynced[:kept]:
            self._apply(self._durable, changes)
        self._unsynced = []
        self._dbs = {name: SortedDict(items) for name, items in self._durable.items()}
        self._open = False

    @staticmethod
    def _apply(dbs: Any, changes: list[_Change]) -> None:
        for db, key, value in changes:
            if value is None:
                dbs[db].pop(key, None)
            else:
                dbs[db][key] = value

    def _commit(self, changes: list[_Change]) -> None:
        self._unsynced.append(changes)


class SimTxn:
    """An `lmdb.Transaction` look-alike: holds the store's lock from begin to end (the
    simulation is serial; the engine's own threads only wait)."""

    def __init__(self, store: SimStore, db: bytes | None, write: bool) -> None:
        self._store = store
        self._db = db
        self._write = write
        self._changes: list[_Change] = []
        self._undo: list[_Change] = []

    def __enter__(self) -> SimTxn:
        self._store._lock.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc_type is None and self._changes:
                if self._store.full:
                    self._abort()
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                self._store._commit(self._changes)
            elif exc_type is not None:
                self._abort()
        finally:
            self._store._lock.__exit__(None, None, None)

    def _abort(self) -> None:
        dbs = self._store._dbs
        for db, key, value in reversed(self._undo):
            if value is None:
                dbs[db].pop(key, None)
            else:
                dbs[db][key] = value
        self._changes = []

    def _map(self, db: bytes | None) -> SortedDict[bytes, bytes]:
        return self._store._dbs[self._db if db is None else db]

    def _set(self, db: bytes | None, key: bytes, value: bytes | None) -> bool:
        if not self._write:
            raise StorageError("write in a read-only transaction")
        name = self._db if db is None else db
        items = self._store._dbs[name]
        old = items.get(key)
        if value is None:
            if old is None:
                return False
            del items[key]
        else:
            items[key] = value
        self._undo.append((name, key, old))
        self._changes.append((name, key, value))
        return True

    def get(self, key: bytes, default: Any = None, db: bytes | None = None) -> Any:
        return self._map(db).get(bytes(key), default)

    def put(self, key: bytes, value: bytes, db: bytes | None = None) -> bool:
        return self._set(db, bytes(key), bytes(value))

    def delete(self, key: bytes, value: bytes = b"", db: bytes | None = None) -> bool:
        return self._set(db, bytes(key), None)

    def cursor(self, db: bytes | None = None) -> SimCursor:
        return SimCursor(self, self._db if db is None else db)

    def stat(self, db: bytes | None = None) -> dict[str, int]:
        return {"entries": len(self._map(db))}


class SimCursor:
    """An `lmdb.Cursor` look-alike over one database (positions are indexes in key order)."""

    def __init__(self, txn: SimTxn, db: bytes | None) -> None:
        self._txn = txn
        self._db = db
        self._items: SortedDict[bytes, bytes] = txn._store._dbs[db]
        self._at = -1  # -1: not positioned

    def _valid(self) -> bool:
        return 0 <= self._at < len(self._items)

    def _position(self, at: int) -> bool:
        self._at = at if 0 <= at < len(self._items) else -1
        return self._at >= 0

    def set_range(self, key: bytes) -> bool:
        return self._position(self._items.bisect_left(bytes(key)))

    def set_key(self, key: bytes) -> bool:
        key = bytes(key)
        at = self._items.bisect_left(key)
        if at < len(self._items) and self._items.peekitem(at)[0] == key:
            return self._position(at)
        return self._position(-1)

    def first(self) -> bool:
        return self._position(0)

    def last(self) -> bool:
        return self._position(len(self._items) - 1)

    def prev(self) -> bool:
        if not self._valid():
            return self.last()
        return self._position(self._at - 1)

    def next(self) -> bool:
        if not self._valid():
            return self.first()
        return self._position(self._at + 1)

    def key(self) -> bytes:
        return self._items.peekitem(self._at)[0] if self._valid() else b""

    def value(self) -> bytes:
        return self._items.peekitem(self._at)[1] if self._valid() else b""

    def delete(self) -> bool:
        """Deletes the current item; the cursor then stands on the next one."""
        if not self._valid():
            return False
        at = self._at
        self._txn._set(self._db, self._items.peekitem(at)[0], None)
        self._position(at)
        return True

    def putmulti(self, items: Iterable[tuple[bytes, bytes]]) -> tuple[int, int]:
        consumed = added = 0
        for key, value in items:
            consumed += 1
            existed = bytes(key) in self._items
            self._txn._set(self._db, bytes(key), bytes(value))
            added += not existed
        return consumed, added

    def iternext(self, keys: bool = True, values: bool = True) -> Iterator[Any]:
        if not self._valid() and not self.first():
            return
        while self._valid():
            key, value = self._items.peekitem(self._at)
            if keys and values:
                yield key, value
            elif keys:
                yield key
            else:
                yield value
            self._at += 1
        self._at = -1

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return self.iternext()
