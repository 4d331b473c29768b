"""What the bookie tells about the requests it answered: counters per RPC and code, entries
read and added per code, and one event per refused request naming who asked."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Protocol

from stream.bookie import metrics
from stream.bookie.access import ANONYMOUS, CALLER
from stream.bookie.codes import OK, code_name
from stream.logs import get_logger

log = get_logger(__name__)


class Peer(Protocol):
    """Who sent a request, for the refusal log when the access interceptor did not say (a
    gRPC context)."""

    def peer(self) -> str: ...


class RequestLog:
    """The counters and refusal events of one bookie. The label values are made once per
    (rpc, code): a name lookup per answer shows on the add path."""

    def __init__(self) -> None:
        self._request_labels: dict[tuple[str, int], tuple[str, str]] = {}
        self._add_ok = self._labels("Add", OK)
        self._ok = (code_name(OK),)

    def _labels(self, rpc: str, code: int) -> tuple[str, str]:
        labels = self._request_labels.get((rpc, code))
        if labels is None:
            labels = self._request_labels[(rpc, code)] = (rpc, code_name(code))
        return labels

    def count(self, rpc: str, code: int) -> None:
        """Counts one answer of `rpc` with `code`."""
        metrics.REQUESTS.inc(self._labels(rpc, code))

    def count_read(self, code: int, entries: int) -> None:
        """Counts `entries` entries read (Read, ReadRange) answered with `code`."""
        metrics.READ_ENTRIES.inc((code_name(code),), entries)

    def count_add(self, codes: Sequence[int]) -> None:
        """Counts one Add batch answered with `codes` (one per entry)."""
        n = len(codes)
        if n and codes.count(OK) == n:
            metrics.ADD_ENTRIES.inc(self._ok, n)
            metrics.REQUESTS.inc(self._add_ok)
            return
        for code, count in collections.Counter(codes).items():
            metrics.ADD_ENTRIES.inc((code_name(code),), count)
        self.count("Add", codes[0] if n else OK)

    def refused(
        self, rpc: str, stream_id: int, reason: str, message: str, context: Peer | None
    ) -> None:
        """One event and one count per refused request, naming who asked (the principal the
        access interceptor found; `anonymous` without mutual TLS)."""
        caller = CALLER.get()
        principal = caller.principal if caller is not None else ANONYMOUS
        peer = caller.peer if caller is not None else context.peer() if context else None
        log.warning(
            "bookie.request_refused",
            rpc=rpc,
            stream_id=stream_id,
            reason=reason,
            message=message,
            principal=principal,
            peer=peer,
        )
        metrics.REFUSED.labels(rpc=rpc, reason=reason).inc()
        metrics.AUDIT_EVENTS.labels(action="refused", principal=principal).inc()
