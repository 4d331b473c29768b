"""Small file-system helpers shared by the journal, the entry logs and the bookie's small
durable files (cookies, the forgotten-terms bound)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Makes the directory entries of `path` durable (a new file must survive a crash)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_durably(path: Path, data: bytes) -> None:
    """Replaces `path` by a file holding `data` so that a crash leaves the old content or the
    new one, never a part: a temporary file, fsync, rename, then the directory's fsync."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
