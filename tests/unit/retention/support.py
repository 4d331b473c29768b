"""Helpers of the retention tests: streams with closed fragments built straight in ZooKeeper
(no bookies)."""

from __future__ import annotations

from collections.abc import Sequence

from stream.metadata import (
    Fragment,
    MetadataSession,
    RetentionPolicy,
    StreamMeta,
    StreamStore,
    paths,
)

E3 = ("b1", "b2", "b3")
NOW_MS = 1_800_000_000_000


def open_stream(
    store: StreamStore,
    name: str,
    policy: RetentionPolicy | None = None,
    *,
    first_created_ms: int = NOW_MS,
    ensemble: tuple[str, ...] = E3,
) -> tuple[StreamMeta, int]:
    """Creates stream `name` and opens it (term 1) with a first fragment on `ensemble`;
    returns `(meta, version)`."""
    meta = store.create_stream(name, 3, 3, 2, 1000, 1 << 20, retention=policy)
    _, version = store.get_stream_by_id(meta.id)
    meta, version, _ = store.begin_takeover(meta.id, version)
    return store.finish_recovery(
        meta.id, version, meta.term, [], [Fragment(0, ensemble, created_ms=first_created_ms)], 0
    )


def build_stream(
    store: StreamStore,
    name: str,
    closed: Sequence[tuple[int | None, int | None]],
    policy: RetentionPolicy | None = None,
    *,
    entries_each: int = 10,
    ensembles: Sequence[tuple[str, ...]] | None = None,
    last_created_ms: int = NOW_MS,
    ensemble: tuple[str, ...] = E3,
) -> StreamMeta:
    """Returns a stream whose closed fragments have `(bytes, last timestamp)` from `closed`,
    `entries_each` entries each, followed by an open last fragment created at
    `last_created_ms`; fragment i lies on `ensembles[i]` (default: all on `ensemble`)."""
    default = ensemble
    meta, version = open_stream(
        store, name, policy, first_created_ms=NOW_MS - 10**9, ensemble=default
    )

    def ensemble_of(i: int) -> tuple[str, ...]:
        return ensembles[i] if ensembles else default

    if ensembles:
        first = Fragment(0, ensemble_of(0), created_ms=NOW_MS - 10**9)
        meta, version = store.add_fragment(meta.id, version, first, replaces_first_id=True)
    for i, (size, last_ts) in enumerate(closed):
        first_id = i * entries_each
        done = Fragment(
            first_id,
            ensemble_of(i),
            created_ms=NOW_MS - 10**9,
            last_entry_id=first_id + entries_each - 1,
            bytes=size,
            last_timestamp_ms=last_ts,
        )
        created = last_created_ms if i == len(closed) - 1 else NOW_MS - 10**9
        after = Fragment(first_id + entries_each, ensemble_of(i + 1), created_ms=created)
        meta, version = store.roll_fragment(meta.id, version, done, after)
    return meta


def bulk_stream(
    session: MetadataSession,
    store: StreamStore,
    name: str,
    count: int,
    size: int,
    policy: RetentionPolicy,
    *,
    ensemble: tuple[str, ...] = E3,
) -> StreamMeta:
    """Returns a stream of `count` closed fragments of `size` bytes and an open last one (all
    on `ensemble`), written straight into ZooKeeper in big multi-ops (building 10^4 fragments
    by rolls would take minutes)."""
    meta, _ = open_stream(store, name, policy, ensemble=ensemble)
    zk = session.zk
    fragments = [
        Fragment(
            i,
            ensemble,
            created_ms=NOW_MS - 10**9,
            last_entry_id=i,
            bytes=size,
            last_timestamp_ms=NOW_MS,
        )
        for i in range(count)
    ] + [Fragment(count, ensemble, created_ms=NOW_MS)]
    for start in range(0, len(fragments), 900):
        txn = zk.transaction()
        for fragment in fragments[start : start + 900]:
            path = paths.stream_fragment(meta.id, fragment.first_entry_id)
            if fragment.first_entry_id == 0:
                txn.set_data(path, fragment.to_json())
            else:
                txn.create(path, fragment.to_json())
        results = txn.commit()
        assert not any(isinstance(r, Exception) for r in results), results
    return meta
