"""Checks on what the bookies of a real cluster hold, shared by the integration tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from stream.metadata import MetadataSession, StreamStore
from stream.sandbox.cluster import SandboxCluster
from stream.wire import bookie_pb2 as pb


def assert_three_live_copies(
    cluster: SandboxCluster,
    session: MetadataSession,
    name: str,
    dead: set[str],
    only_first: int | None = None,
) -> None:
    """Every closed fragment of `name` (or only the one starting at `only_first`) holds each
    of its entries on every bookie of its (E = WQ) ensemble, none of them dead."""
    store = StreamStore(session)
    meta, _ = store.get_stream(name)
    fragments = store.get_fragments(meta.id)
    for i, fragment in enumerate(fragments[:-1]):
        if only_first is not None and fragment.first_entry_id != only_first:
            continue
        assert not dead & set(fragment.ensemble), fragment
        first = max(fragment.first_entry_id, meta.first_entry_id)
        last = fragments[i + 1].first_entry_id - 1
        for bookie_id in fragment.ensemble:
            got = [
                e.entry_id
                for r in cluster.bookie(bookie_id)
                .stub()
                .ReadRange(
                    pb.ReadRangeRequest(
                        stream_id=meta.id, first_entry_id=first, last_entry_id=last
                    ),
                    timeout=30,
                )
                for e in r.entries
            ]
            assert got == list(range(first, last + 1)), (name, bookie_id, first, last)


@contextlib.contextmanager
def session_of(cluster: SandboxCluster) -> Iterator[MetadataSession]:
    session = MetadataSession.connect(cluster.metadata, session_timeout_s=4.0)
    try:
        yield session
    finally:
        session.close()
