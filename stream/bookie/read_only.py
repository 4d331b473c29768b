"""Read-only mode: a bookie refuses writers' adds and truncates while its disk is nearly full
or while it is being drained (decommission: writers move their fragments elsewhere; reads,
trims and recovery adds are still served)."""

from __future__ import annotations

from stream.bookie import metrics
from stream.bookie.disk import DiskStatus
from stream.logs import get_logger

log = get_logger(__name__)


class ReadOnlyMode:
    """Whether the bookie is read-only, from the latest disk check and the drain flag; logs
    and exports each change. `disk_usage_threshold` only goes into the log line."""

    def __init__(self, disk_status: DiskStatus | None, disk_usage_threshold: float) -> None:
        self.disk_status = disk_status
        self.draining = False
        self._threshold = disk_usage_threshold

    @property
    def read_only(self) -> bool:
        return self.draining or (self.disk_status is not None and self.disk_status.read_only)

    def reason(self) -> str:
        """Returns the message of a request refused for read-only mode."""
        return (
            "bookie is read-only (draining)" if self.draining else "bookie is read-only (disk full)"
        )

    def set_draining(self, draining: bool) -> None:
        """Switches drain mode (`/bookies/draining/<bookie_id>` exists)."""
        if draining != self.draining:
            log.warning("bookie.draining" if draining else "bookie.drain_cancelled")
        self.draining = draining
        metrics.READ_ONLY.set(1 if self.read_only else 0)

    def set_disk_status(self, status: DiskStatus) -> None:
        """Records the latest disk check; read-only mode follows it."""
        old = self.disk_status
        if (old is not None and old.read_only) != status.read_only:
            log.warning(
                "bookie.read_only" if status.read_only else "bookie.writable",
                fullest_dir=status.fullest_dir,
                used_fraction=round(status.used_fraction, 4),
                threshold=self._threshold,
            )
        self.disk_status = status
        metrics.READ_ONLY.set(1 if self.read_only else 0)
