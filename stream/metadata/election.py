"""Leader elections over kazoo's Lock recipe (the retention service, the auditor)."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from stream.errors import StreamError
from stream.metadata.connection import MetadataSession

log = structlog.get_logger(__name__)


async def holds_lock(session: MetadataSession, lock: Any, path: str) -> bool:
    """Returns whether `lock` (a kazoo Lock under `path`) still has its node and the node
    belongs to the session's current incarnation: kazoo's `is_acquired` stays True after the
    session that held it expired, and its `acquire` contends again on a new session."""
    node = lock.node
    if node is None:
        return False
    try:
        stat = await asyncio.to_thread(session.retry, session.zk.exists, f"{path}/{node}")
    except StreamError as e:
        log.warning("election.leadership_unknown", path=path, error=str(e))
        return False
    return stat is not None and stat.ephemeralOwner == session.session_id
