"""A stream's fragments as the retention service reads them: the znode names at once, the
fragment contents only where the policy looks (the newest ones for a size limit, the oldest
for an age limit, those it deletes). A round then costs what it deletes plus a small window,
not the whole retained history of every stream.

Consistency: the `meta` znode (with its version) is read BEFORE the fragment names and
contents, and every change to a stream's fragments rewrites `meta` (stream/metadata/streams.py).
So whatever was read after `meta` at version V is what V says, unless the version moved, and
then the trim CAS at V fails and the service reads again. A fragment found gone while reading
raises `StaleFragments` (the version moved)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

from kazoo.exceptions import NoNodeError

from stream.errors import MetadataError, StreamNotFoundError
from stream.metadata import MetadataSession, paths
from stream.metadata.model import Fragment

# Fragment znodes fetched around a missing index, in one pipelined batch each way.
_BATCH = 64


class StaleFragments(MetadataError):
    """A fragment znode vanished while being read: the stream changed; read it again."""


class FragmentWindow(Sequence[Fragment]):
    """The fragments of one stream (sorted by first entry id) as of one meta version,
    fetched from ZooKeeper on first access in pipelined batches; blocking (call from a
    worker thread). Slices share the fetched fragments."""

    def __init__(
        self,
        session: MetadataSession,
        stream_id: int,
        first_entry_ids: list[int],
        cache: dict[int, Fragment] | None = None,
        reads: list[int] | None = None,
    ) -> None:
        self._session = session
        self._stream_id = stream_id
        self._firsts = first_entry_ids
        self._cache: dict[int, Fragment] = {} if cache is None else cache
        # Znodes read from ZooKeeper, shared with slices (one cell, mutable).
        self._reads = [0] if reads is None else reads

    @property
    def first_entry_ids(self) -> list[int]:
        """Returns the first entry ids of the fragments (known without fetching)."""
        return list(self._firsts)

    @property
    def reads(self) -> int:
        """Returns how many fragment znodes this window and its slices read from ZooKeeper."""
        return self._reads[0]

    def closed_known(self) -> dict[int, Fragment]:
        """Returns the known fragments of this window but its last one, by first entry id:
        what may be remembered for the next round (a fragment that is not the last never
        changes what retention looks at: its size, timestamps and range are final)."""
        if not self._firsts:
            return {}
        last = self._firsts[-1]
        return {f: self._cache[f] for f in self._firsts if f != last and f in self._cache}

    def __len__(self) -> int:
        return len(self._firsts)

    @overload
    def __getitem__(self, index: int) -> Fragment: ...

    @overload
    def __getitem__(self, index: slice) -> FragmentWindow: ...

    def __getitem__(self, index: int | slice) -> Fragment | FragmentWindow:
        if isinstance(index, slice):
            if index.step not in (None, 1):
                raise ValueError("fragment windows slice contiguously")
            return FragmentWindow(
                self._session, self._stream_id, self._firsts[index], self._cache, self._reads
            )
        if index < 0:
            index += len(self._firsts)
        if not 0 <= index < len(self._firsts):
            raise IndexError(index)
        first = self._firsts[index]
        if first not in self._cache:
            self._fetch_around(index)
        return self._cache[first]

    def _fetch_around(self, index: int) -> None:
        """Reads the fragments within `_BATCH` of `index` that are not fetched yet."""
        low, high = max(0, index - _BATCH + 1), min(len(self._firsts), index + _BATCH)
        wanted = [f for f in self._firsts[low:high] if f not in self._cache]
        zk = self._session.zk
        stream_id = self._stream_id

        def read_batch() -> list[tuple[int, bytes]]:
            pending = [(f, zk.get_async(paths.stream_fragment(stream_id, f))) for f in wanted]
            return [(f, result.get()[0]) for f, result in pending]

        try:
            raw = self._session.retry(read_batch)
        except NoNodeError:
            raise StaleFragments("a fragment vanished while reading", stream_id=stream_id) from None
        self._reads[0] += len(raw)
        for first, data in raw:
            try:
                fragment = Fragment.from_json(data)
            except MetadataError as exc:
                raise MetadataError(exc.message, stream_id=stream_id, fragment=first) from exc
            if fragment.first_entry_id != first:
                raise MetadataError(
                    "fragment znode name and content disagree", stream_id=stream_id, name=first
                )
            self._cache[first] = fragment


def read_fragments(
    session: MetadataSession, stream_id: int, known: dict[int, Fragment] | None = None
) -> FragmentWindow:
    """Returns the stream's fragments as a window (names now, contents lazily). Read the
    stream's meta BEFORE calling this: the window is then consistent with that meta version
    (see the module docstring). `known`: fragments remembered from an earlier read (from
    `closed_known`), used where their names are still there but not as the last fragment.
    Raises `StreamNotFoundError`."""
    try:
        names = session.retry(session.zk.get_children, paths.stream_fragments(stream_id))
    except NoNodeError:
        raise StreamNotFoundError("stream not found", stream_id=stream_id) from None
    firsts = []
    for name in names:
        if not name.isascii() or not name.isdigit():
            raise MetadataError("malformed fragment znode name", stream_id=stream_id, name=name)
        firsts.append(int(name))
    firsts.sort()
    cache: dict[int, Fragment] = {}
    if known and firsts:
        last = firsts[-1]
        cache = {f: known[f] for f in firsts if f != last and f in known}
    return FragmentWindow(session, stream_id, firsts, cache)
