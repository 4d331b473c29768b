"""ZooKeeper multi-ops: one operation, the bound on a multi-op's size, and which op failed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import RolledBackError, RuntimeInconsistency

# ZooKeeper refuses requests above jute.maxbuffer (1 MiB by default); a delete or a fragment
# znode costs well under 1 KiB, so this many ops stay far below it.
MAX_OPS_PER_MULTI = 1000


@dataclass(frozen=True)
class Op:
    """One operation of a ZooKeeper multi-op."""

    kind: str  # "create" | "set_data" | "delete"
    path: str
    data: bytes = b""
    version: int = -1

    def add_to(self, txn: Any) -> None:
        if self.kind == "create":
            txn.create(self.path, self.data)
        elif self.kind == "set_data":
            txn.set_data(self.path, self.data, self.version)
        elif self.kind == "delete":
            txn.delete(self.path, self.version)
        else:
            raise ValueError(f"unknown multi-op kind {self.kind!r}")


def first_error(results: Sequence[Any]) -> tuple[int, Exception] | None:
    """Returns the index and error of the op that failed a multi-op, None when it succeeded.
    The ops around the failing one report RolledBack/RuntimeInconsistency, not the cause."""
    for index, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(
            result, RolledBackError | RuntimeInconsistency
        ):
            return index, result
    return None
