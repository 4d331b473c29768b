"""Disk-space checks of a bookie's directories: above `disk_usage_threshold` the bookie turns
read-only (adds and truncations refused with READ_ONLY) until space comes back."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DiskStatus:
    """The state of the fullest disk among a bookie's directories."""

    read_only: bool  # some directory's disk is used above the threshold
    free_bytes: int  # least free space (for unprivileged writers) among the directories
    total_bytes: int  # size of the disk with the least free space
    fullest_dir: str  # the directory whose disk is the most used
    used_fraction: float  # how much of that disk is used, in [0, 1]


def _existing_ancestor(path: Path) -> Path:
    # A directory may not exist yet (first boot); its disk is that of its nearest ancestor.
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disks(directories: Iterable[Path], threshold: float) -> DiskStatus:
    """Returns the disk status of `directories`: read-only when the used fraction of any of
    their disks is above `threshold` (a fraction in (0, 1])."""
    fullest: tuple[float, str] = (-1.0, "")
    least_free: tuple[int, int] = (-1, 0)
    for directory in directories:
        usage = shutil.disk_usage(_existing_ancestor(directory))
        used = 1.0 - usage.free / usage.total if usage.total else 1.0
        if used > fullest[0]:
            fullest = (used, str(directory))
        if least_free[0] < 0 or usage.free < least_free[0]:
            least_free = (usage.free, usage.total)
    return DiskStatus(
        read_only=fullest[0] > threshold,
        free_bytes=max(least_free[0], 0),
        total_bytes=least_free[1],
        fullest_dir=fullest[1],
        used_fraction=max(fullest[0], 0.0),
    )
