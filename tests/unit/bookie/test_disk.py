"""Disk checks: read-only above the threshold, on the disk of each directory."""

from __future__ import annotations

import shutil
from pathlib import Path

from stream.bookie.disk import check_disks


def test_threshold_switches_read_only(tmp_path: Path) -> None:
    usage = shutil.disk_usage(tmp_path)
    used = 1 - usage.free / usage.total
    below = check_disks([tmp_path], threshold=min(used + 0.01, 1.0))
    assert not below.read_only
    assert 0 < below.free_bytes <= usage.total
    assert below.total_bytes == usage.total
    assert abs(below.used_fraction - used) < 0.01
    above = check_disks([tmp_path], threshold=max(used - 0.01, 1e-9))
    assert above.read_only
    assert above.fullest_dir == str(tmp_path)


def test_missing_directory_uses_its_ancestors_disk(tmp_path: Path) -> None:
    status = check_disks([tmp_path / "not" / "yet"], threshold=1.0)
    assert status.total_bytes == shutil.disk_usage(tmp_path).total
    assert not status.read_only
