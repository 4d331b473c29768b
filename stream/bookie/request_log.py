"""What the bookie tells about the requests it answered: counters per RPC and code, entries
read and added per code, and one event per refused request naming who asked."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Protocol

import structlog
from prometheus_client import Counter

from stream.bookie import metrics
from stream.bookie.access import ANONYMOUS, CALLER
from stream.bookie.codes import OK, code_name

log = structlog.get_logger(__name__)


class Peer(Protocol):
    """Who sent a request, for the refusal log when the access interceptor did not say (a
    gRPC context)."""

    def peer(self) -> str: ...


class RequestLog:
    """The counters and refusal events of one bookie. The labelled counters are looked up once
    per label set: a lookup per answer shows on the add path."""

    def __init__(self) -> None:
        self._add_entries_ok = metrics.ADD_ENTRIES.labels(code="OK")
        self._request_counters: dict[tuple[str, int], Counter] = {}
        self._read_counters: dict[int, Counter] = {}

    def count(self, rpc: str, code: int) -> None:
        """Counts one answer of `rpc` with `code`."""
        counter = self._request_counters.get((rpc, code))
        if counter is None:
            counter = metrics.REQUESTS.labels(rpc=rpc, code=code_name(code))
            self._request_counters[(rpc, code)] = counter
        counter.inc()

    def count_read(self, code: int, entries: int) -> None:
        """Counts `entries` entries read (Read, ReadRange) answered with `code`."""
        counter = self._read_counters.get(code)
        if counter is None:
            counter = self._read_counters[code] = metrics.READ_ENTRIES.labels(code=code_name(code))
        counter.inc(entries)

    def count_add(self, codes: Sequence[int]) -> None:
        """Counts one Add batch answered with `codes` (one per entry)."""
        n = len(codes)
        if n and codes.count(OK) == n:
            self._add_entries_ok.inc(n)
        else:
            for code, count in collections.Counter(codes).items():
                metrics.ADD_ENTRIES.labels(code=code_name(code)).inc(count)
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
