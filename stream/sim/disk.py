"""An in-memory disk for the storage engine's `DiskPort`: what reads see is what was written,
but a `crash()` keeps only what was synced, the way a power cut does.

- Files: `fdatasync`/`fsync` make a file's bytes durable; a crash brings each file back to its
  synced bytes and, seeded, keeps a torn part of the unsynced bytes after them (a prefix in
  file order, as sequential writes reach a disk).
- Names: a new, renamed or unlinked name is durable once its directory is synced
  (`fsync_dir`); a crash brings back the names of the last sync. Directories themselves are
  durable at once (the engine creates them once, before anything else).
- The index store has LMDB's transaction and cursor API; a committed write transaction is
  durable after `sync()`, and a crash keeps the synced state plus, seeded, a prefix of the
  transactions committed after it (LMDB without meta sync may keep any of them).
- `wipe()` loses everything (a replaced disk); `set_fault("full")` makes writes fail with
  ENOSPC; `set_fault("read_only")` is read by the bookie as its disk checker's verdict.

Every operation takes one lock: the engine's threads may call in concurrently.
"""

from __future__ import annotations

import errno
import os
import random
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sortedcontainers import SortedDict

from stream.sim.disk_store import SimStore

DiskFault = Literal["read_only", "full"]
PathLike = str | Path


@dataclass
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    synced: bytes = b""


@dataclass
class _Fd:
    inode: _Inode
    writable: bool
    position: int = 0


def _key(path: PathLike) -> str:
    return os.path.normpath(os.fspath(path))


# What every operation raises once the power is cut (named, so that the simulator tells it
# from a real I/O error when the storage engine logs it).
POWER_CUT = "simulated power cut"


def _eio() -> OSError:
    return OSError(errno.EIO, f"{os.strerror(errno.EIO)} ({POWER_CUT})")


class _Guard:
    """Holds the disk's lock for one operation; fails it once the power is cut."""

    def __init__(self, disk: SimDisk) -> None:
        self._disk = disk

    def __enter__(self) -> None:
        self._disk._lock.acquire()
        if self._disk._dead:
            self._disk._lock.release()
            raise _eio()

    def __exit__(self, *exc: object) -> None:
        self._disk._lock.release()


def _missing(path: PathLike) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fspath(path))


class SimDisk:
    """One bookie's disk (every directory of its storage), in memory."""

    def __init__(self, rng: random.Random, *, torn_tails: bool = True) -> None:
        self._rng = rng
        self._torn_tails = torn_tails
        self._lock = threading.RLock()
        self._names: SortedDict[str, _Inode] = SortedDict()  # path -> _Inode, what reads see
        self._durable_names: dict[str, _Inode] = {}  # what a crash brings back
        self._dirs: set[str] = set()
        self._fds: dict[int, _Fd] = {}
        self._next_fd = 3
        self._stores: dict[str, SimStore] = {}
        self.fault: DiskFault | None = None
        self.crashes = 0
        # Files that held unsynced bytes at a crash (the crash landed in the middle of work).
        self.unsynced_at_crash = 0
        self._guard = _Guard(self)
        self._syncs_left: int | None = None  # syncs before a power cut, when one is set
        self._dead = False  # the power is cut: every operation fails until crash()

    # -- faults -----------------------------------------------------------------------------

    def set_fault(self, kind: DiskFault | None) -> None:
        """Sets the disk's fault: "full" (writes fail with ENOSPC), "read_only" (for the disk
        checker) or None."""
        if kind not in ("read_only", "full", None):
            raise ValueError(f"unknown disk fault {kind!r}: read_only, full or None")
        with self._lock:
            self.fault = kind
            for store in self._stores.values():
                store.full = kind == "full"

    def cut_power_at_sync(self, syncs: int | None) -> None:
        """Lets `syncs` more syncs (file, directory or index) succeed; the next one fails
        with EIO, as does every operation after it, until `crash()` (a power cut in the
        middle of the engine's work: what it wrote since its last sync is not durable).
        None disarms a cut that has not hit yet."""
        with self._lock:
            self._syncs_left = syncs

    @property
    def power_cut(self) -> bool:
        """Returns whether the power is cut (every operation fails until `crash()`)."""
        return self._dead

    def _synced(self) -> None:
        """Counts one sync towards a power cut set by `cut_power_at_sync`."""
        if self._syncs_left is None:
            return
        if self._syncs_left == 0:
            self._dead = True
            raise _eio()
        self._syncs_left -= 1

    def crash(self) -> None:
        """A power cut: open files are gone, each file holds its synced bytes (plus, when
        torn tails are on, a seeded part of the unsynced ones) and the names are those of
        the last directory syncs."""
        with self._lock:
            self.crashes += 1
            self._dead = False
            self._syncs_left = None
            self._fds.clear()
            survivors: dict[int, _Inode] = {}
            self._names = SortedDict(self._durable_names)
            for inode in self._names.values():
                if id(inode) not in survivors:
                    survivors[id(inode)] = inode
                    self._settle(inode)
            for store in self._stores.values():
                store.crash(self._rng if self._torn_tails else None)

    def wipe(self) -> None:
        """Loses everything: files, directories and the index store."""
        with self._lock:
            self._names.clear()
            self._durable_names.clear()
            self._dirs.clear()
            self._fds.clear()
            self._stores.clear()
            self._dead = False
            self._syncs_left = None

    def _settle(self, inode: _Inode) -> None:
        synced = inode.synced
        data = inode.data
        kept = synced
        if data != synced:
            self.unsynced_at_crash += 1
        if self._torn_tails and len(data) > len(synced):
            same = 0
            limit = len(synced)
            while same < limit and data[same] == synced[same]:
                same += 1
            if same == limit:  # only appended bytes are unsynced: lose them, or a seeded part
                # Half the time all of them: a cut at a uniform byte alone would nearly always
                # keep a small journal group's records whole, its padding being most of it.
                lost = self._rng.random() < 0.5
                cut = limit if lost else self._rng.randint(limit, len(data))
                kept = bytes(data[:cut])
        inode.data = bytearray(kept)
        inode.synced = kept

    def _check_space(self) -> None:
        if self.fault == "full":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    # -- files ------------------------------------------------------------------------------

    def open(self, path: PathLike, flags: int, mode: int = 0o777) -> int:
        key = _key(path)
        with self._guard:
            inode = self._names.get(key)
            if flags & os.O_CREAT:
                if inode is not None and flags & os.O_EXCL:
                    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), key)
                if inode is None:
                    if os.path.dirname(key) not in self._dirs:
                        raise _missing(path)
                    inode = self._names[key] = _Inode()
            elif inode is None:
                raise _missing(path)
            fd = self._next_fd
            self._next_fd += 1
            writable = bool(flags & (os.O_WRONLY | os.O_RDWR))
            self._fds[fd] = _Fd(inode, writable)
            return fd

    def _fd(self, fd: int, *, write: bool = False) -> _Fd:
        handle = self._fds.get(fd)
        if handle is None or (write and not handle.writable):
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return handle

    def close(self, fd: int) -> None:
        with self._lock:  # closing works even without power: the process lets go
            self._fd(fd)
            del self._fds[fd]

    def write(self, fd: int, data: bytes) -> int:
        with self._guard:
            handle = self._fd(fd, write=True)
            n = self._put(handle.inode, bytes(data), handle.position)
            handle.position += n
            return n

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        with self._guard:
            return self._put(self._fd(fd, write=True).inode, bytes(data), offset)

    def pwritev(self, fd: int, buffers: Sequence[bytes], offset: int) -> int:
        with self._guard:
            return self._put(self._fd(fd, write=True).inode, b"".join(buffers), offset)

    def _put(self, inode: _Inode, data: bytes, offset: int) -> int:
        self._check_space()
        if not data:  # an empty write does not extend the file
            return 0
        if offset > len(inode.data):
            inode.data.extend(bytes(offset - len(inode.data)))
        inode.data[offset : offset + len(data)] = data
        return len(data)

    def set_direct(self, fd: int, on: bool) -> bool:
        with self._guard:
            self._fd(fd)
            return on  # bytes reach this disk the same way either way

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        with self._guard:
            return bytes(self._fd(fd).inode.data[offset : offset + length])

    def fdatasync(self, fd: int) -> None:
        with self._guard:
            inode = self._fd(fd).inode
            self._synced()
            inode.synced = bytes(inode.data)

    fsync = fdatasync

    def ftruncate(self, fd: int, size: int) -> None:
        with self._guard:
            inode = self._fd(fd, write=True).inode
            if size < len(inode.data):
                del inode.data[size:]
            else:
                self._check_space()
                inode.data.extend(bytes(size - len(inode.data)))

    def fsize(self, fd: int) -> int:
        with self._guard:
            return len(self._fd(fd).inode.data)

    def size(self, path: PathLike) -> int:
        with self._guard:
            inode = self._names.get(_key(path))
            if inode is None:
                raise _missing(path)
            return len(inode.data)

    allocated = size

    @contextmanager
    def mapped(self, path: PathLike) -> Iterator[bytes]:
        with self._guard:
            inode = self._names.get(_key(path))
            if inode is None:
                raise _missing(path)
            data = bytes(inode.data)
        yield data

    # -- names ------------------------------------------------------------------------------

    def listdir(self, path: PathLike) -> list[str]:
        key = _key(path)
        with self._guard:
            if key not in self._dirs:
                raise _missing(path)
            prefix = key + os.sep
            return [
                name[len(prefix) :]
                for name in self._names.irange(prefix, prefix + "\uffff")
                if os.sep not in name[len(prefix) :]
            ]

    def rename(self, src: PathLike, dst: PathLike) -> None:
        with self._guard:
            inode = self._names.pop(_key(src), None)
            if inode is None:
                raise _missing(src)
            self._names[_key(dst)] = inode

    def unlink(self, path: PathLike) -> None:
        with self._guard:
            if self._names.pop(_key(path), None) is None:
                raise _missing(path)

    def mkdir(self, path: Path) -> None:
        key = _key(path)
        with self._guard:
            while key not in self._dirs and key != os.path.dirname(key):
                self._dirs.add(key)
                key = os.path.dirname(key)

    def fsync_dir(self, path: Path) -> None:
        key = _key(path)
        with self._guard:
            if key not in self._dirs:
                raise _missing(path)
            self._synced()
            in_dir = {
                name: inode
                for name, inode in self._durable_names.items()
                if os.path.dirname(name) != key
            }
            in_dir.update(
                (name, inode) for name, inode in self._names.items() if os.path.dirname(name) == key
            )
            self._durable_names = in_dir

    # -- the index store ----------------------------------------------------------------------

    def open_index_env(self, path: str, **options: Any) -> SimStore:
        key = _key(path)
        with self._guard:
            self.mkdir(Path(key))
            store = self._stores.get(key)
            if store is None:
                store = self._stores[key] = SimStore(self._guard, self._synced)
                store.full = self.fault == "full"
            store.reopen()
            return store

    # -- for tests ----------------------------------------------------------------------------

    def files(self) -> dict[str, bytes]:
        """Returns every file's path and bytes (what reads see now)."""
        with self._lock:
            return {name: bytes(inode.data) for name, inode in self._names.items()}
