"""The storage engine's disk port: every file operation of the journal, the entry logs, the
index and replay goes through one `DiskPort`, so that the simulator can run the same engine
over an in-memory disk that loses what was not synced (stream/sim/disk.py).

The port mirrors the `os` calls the engine makes (file descriptors, positional writes), so the
production port is those functions themselves: no wrapper call on any path, hot or not.
The index's key-value store is the port's too: `open_index_env` returns an LMDB environment in
production and an object with the same transaction and cursor API in the simulator.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

import lmdb

from stream.bookie.storage.fsutil import fsync_dir

PathLike = str | Path


class DiskPort(Protocol):
    """The file and key-value operations the storage engine uses. Errors are `OSError`s as
    the `os` module raises them (FileNotFoundError, FileExistsError, ENOSPC...)."""

    # Positional-only methods, not Callable attributes: a protocol's attribute is settable,
    # hence invariant, and `os.close(fd)` would not match `Callable[[int], None]` then.
    def open(self, path: PathLike, flags: int, mode: int = 0o777, /) -> int: ...
    def close(self, fd: int, /) -> None: ...
    def write(self, fd: int, data: bytes, /) -> int: ...
    def pwrite(self, fd: int, data: bytes | memoryview, offset: int, /) -> int: ...
    def pwritev(self, fd: int, buffers: Sequence[bytes], offset: int, /) -> int: ...
    def pread(self, fd: int, length: int, offset: int, /) -> bytes: ...
    def fdatasync(self, fd: int, /) -> None: ...
    def fsync(self, fd: int, /) -> None: ...
    def ftruncate(self, fd: int, size: int, /) -> None: ...
    def listdir(self, path: PathLike, /) -> list[str]: ...
    def rename(self, src: PathLike, dst: PathLike, /) -> None: ...
    def unlink(self, path: PathLike, /) -> None: ...

    def fsize(self, fd: int) -> int:
        """Returns the size in bytes of the open file `fd`."""
        ...

    def set_direct(self, fd: int, on: bool) -> bool:
        """Turns O_DIRECT on or off for the open file `fd`; returns whether it is on (off
        where the filesystem refuses it)."""
        ...

    def size(self, path: PathLike) -> int:
        """Returns the size in bytes of the file at `path` (FileNotFoundError if none)."""
        ...

    def allocated(self, path: PathLike) -> int:
        """Returns the bytes that the file at `path` occupies (a sparse file less than its
        size); FileNotFoundError if none."""
        ...

    def mkdir(self, path: Path) -> None:
        """Creates the directory `path` and its parents when missing."""
        ...

    def fsync_dir(self, path: Path) -> None:
        """Makes the names in directory `path` durable (a new or renamed file survives a
        crash)."""
        ...

    def mapped(self, path: PathLike) -> AbstractContextManager[Any]:
        """Returns a context manager over the bytes of the (non-empty) file at `path`, read
        only: a buffer that supports slicing and `struct.unpack_from`."""
        ...

    def open_index_env(
        self,
        path: str,
        *,
        map_size: int,
        max_dbs: int,
        writemap: bool,
        metasync: bool,
        sync: bool,
        readahead: bool,
        max_spare_txns: int,
    ) -> Any:
        """Opens the index's key-value store at `path`: an `lmdb.Environment` (or the same
        API) with those of `lmdb.open`'s options that the index sets."""
        ...


@contextmanager
def _mapped(path: PathLike) -> Iterator[mmap.mmap]:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        yield data


def _set_direct(fd: int, on: bool) -> bool:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT if on else flags & ~os.O_DIRECT)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return False
    return on


def _mkdir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


class OsDisk:
    """The production port: the `os` module and LMDB."""

    open = staticmethod(os.open)
    close = staticmethod(os.close)
    write = staticmethod(os.write)
    pwrite = staticmethod(os.pwrite)
    pwritev = staticmethod(os.pwritev)
    pread = staticmethod(os.pread)
    fdatasync = staticmethod(os.fdatasync)
    fsync = staticmethod(os.fsync)
    ftruncate = staticmethod(os.ftruncate)
    listdir = staticmethod(os.listdir)
    rename = staticmethod(os.rename)
    unlink = staticmethod(os.unlink)
    mkdir = staticmethod(_mkdir)
    fsync_dir = staticmethod(fsync_dir)
    mapped = staticmethod(_mapped)
    set_direct = staticmethod(_set_direct)
    open_index_env = staticmethod(lmdb.open)

    @staticmethod
    def fsize(fd: int) -> int:
        return os.fstat(fd).st_size

    @staticmethod
    def size(path: PathLike) -> int:
        return os.stat(path).st_size

    @staticmethod
    def allocated(path: PathLike) -> int:
        return os.stat(path).st_blocks * 512


OS_DISK: DiskPort = OsDisk()
