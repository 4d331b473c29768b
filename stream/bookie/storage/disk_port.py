"""The storage engine's disk port: every file operation of the journal, the entry logs, the
index and replay goes through one `DiskPort`, so that the simulator can run the same engine
over an in-memory disk that loses what was not synced (stream/sim/disk.py).

The port mirrors the `os` calls the engine makes (file descriptors, positional writes), so the
production port is those functions themselves: no wrapper call on any path, hot or not.
The index's key-value store is the port's too: `open_index_env` returns an LMDB environment in
production and an object with the same transaction and cursor API in the simulator.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

import lmdb

from stream.bookie.storage.fsutil import fsync_dir

PathLike = str | Path


class DiskPort(Protocol):
    """The file and key-value operations the storage engine uses. Errors are `OSError`s as
    the `os` module raises them (FileNotFoundError, FileExistsError, ENOSPC...)."""

    open: Callable[..., int]  # (path, flags, mode=0o777) -> fd
    close: Callable[[int], None]
    write: Callable[[int, bytes], int]
    pwrite: Callable[[int, bytes, int], int]
    pwritev: Callable[[int, Sequence[bytes], int], int]
    pread: Callable[[int, int, int], bytes]
    fdatasync: Callable[[int], None]
    fsync: Callable[[int], None]
    ftruncate: Callable[[int, int], None]
    listdir: Callable[[PathLike], list[str]]
    rename: Callable[[PathLike, PathLike], None]
    unlink: Callable[[PathLike], None]

    def fsize(self, fd: int) -> int:
        """Returns the size in bytes of the open file `fd`."""
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

    def open_index_env(self, path: str, **options: Any) -> Any:
        """Opens the index's key-value store at `path`: an `lmdb.Environment` (or the same
        API) with `lmdb.open`'s options."""
        ...


@contextmanager
def _mapped(path: PathLike) -> Iterator[mmap.mmap]:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        yield data


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
