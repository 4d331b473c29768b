"""`MetadataPort` over ZooKeeper: the blocking `StreamStore`/`BookieRegistry` calls of
`stream.metadata`, run on a small thread pool so that the event loop never blocks; watches are
delivered on the loop thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from stream.metadata import (
    AcceptedLoss,
    BookieRegistry,
    CursorPosition,
    CursorStore,
    Fragment,
    MetadataSession,
    ProducerChange,
    RetentionPolicy,
    StreamMeta,
    StreamState,
    StreamStore,
    WriterInfo,
)
from stream.protocol import BookieCandidate

T = TypeVar("T")


class ZkMetadata:
    """The client's metadata port on one ZooKeeper session (not owned: close it yourself).
    Also the address book of the gRPC transport (`bookie_address`)."""

    def __init__(self, session: MetadataSession, *, max_threads: int = 4) -> None:
        self.session = session
        self.store = StreamStore(session)
        self.registry = BookieRegistry(session)
        self.cursors = CursorStore(session)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_threads, thread_name_prefix="streamkeeper-metadata"
        )
        self._addresses: dict[str, str] = {}
        self._data_addresses: dict[str, str] = {}

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def create_stream(
        self,
        name: str,
        ensemble: int,
        write_quorum: int,
        ack_quorum: int,
        fragment_max_entries: int,
        fragment_max_bytes: int,
        fragment_max_age_s: float | None = None,
        retention: RetentionPolicy | None = None,
    ) -> StreamMeta:
        return await self._run(
            self.store.create_stream,
            name,
            ensemble,
            write_quorum,
            ack_quorum,
            fragment_max_entries,
            fragment_max_bytes,
            fragment_max_age_s,
            retention,
        )

    async def get_stream(self, name: str) -> tuple[StreamMeta, int]:
        return await self._run(self.store.get_stream, name)

    async def get_snapshot(self, stream_id: int) -> tuple[StreamMeta, int, list[Fragment]]:
        return await self._run(self.store.get_snapshot, stream_id)

    async def begin_takeover(
        self, stream_id: int, expected_version: int
    ) -> tuple[StreamMeta, int, Fragment | None]:
        return await self._run(self.store.begin_takeover, stream_id, expected_version)

    async def finish_recovery(
        self,
        stream_id: int,
        expected_version: int,
        term: int,
        fragments_changed: Sequence[Fragment],
        new_fragments: Sequence[Fragment],
        first_entry_id_of_term: int,
        producers: ProducerChange | None = None,
    ) -> tuple[StreamMeta, int]:
        return await self._run(
            self.store.finish_recovery,
            stream_id,
            expected_version,
            term,
            fragments_changed,
            new_fragments,
            first_entry_id_of_term,
            producers,
        )

    async def record_accepted_loss(
        self, stream_id: int, expected_version: int, loss: AcceptedLoss
    ) -> tuple[StreamMeta, int]:
        return await self._run(self.store.record_accepted_loss, stream_id, expected_version, loss)

    async def add_fragment(
        self, stream_id: int, expected_version: int, new_fragment: Fragment, replaces_first_id: bool
    ) -> tuple[StreamMeta, int]:
        return await self._run(
            self.store.add_fragment, stream_id, expected_version, new_fragment, replaces_first_id
        )

    async def roll_fragment(
        self,
        stream_id: int,
        expected_version: int,
        closed_fragment: Fragment,
        new_fragment: Fragment,
        producers: ProducerChange | None = None,
    ) -> tuple[StreamMeta, int]:
        return await self._run(
            self.store.roll_fragment,
            stream_id,
            expected_version,
            closed_fragment,
            new_fragment,
            producers,
        )

    async def set_state(
        self, stream_id: int, expected_version: int, state: StreamState
    ) -> tuple[StreamMeta, int]:
        return await self._run(self.store.set_state, stream_id, expected_version, state)

    async def set_retention(
        self, stream_id: int, retention: RetentionPolicy | None
    ) -> tuple[StreamMeta, int]:
        return await self._run(self.store.set_retention, stream_id, retention)

    async def trim_fragments(
        self,
        stream_id: int,
        expected_version: int,
        fragment_first_ids_to_delete: Sequence[int],
        new_first_entry_id: int,
    ) -> tuple[StreamMeta, int]:
        return await self._run(
            self.store.trim_fragments,
            stream_id,
            expected_version,
            list(fragment_first_ids_to_delete),
            new_first_entry_id,
        )

    async def delete_stream(self, name: str) -> None:
        await self._run(self.store.delete_stream, name)

    async def register_writer(self, stream_id: int, info: WriterInfo) -> None:
        await self._run(self.store.register_writer, stream_id, info)

    async def unregister_writer(self, stream_id: int) -> None:
        await self._run(self.store.unregister_writer, stream_id)

    async def get_writer(self, stream_id: int) -> WriterInfo | None:
        """Returns the registered writer of the stream (not part of the port)."""
        return await self._run(self.store.get_writer, stream_id)

    async def list_streams(self) -> list[str]:
        """Returns every stream name (not part of the port)."""
        return await self._run(self.store.list_streams)

    # Cursors (not part of the port: the writer, recovery and simulator never use them).

    async def get_cursor(self, stream_id: int, name: str) -> CursorPosition | None:
        """Returns the cursor's committed position, None when it does not exist."""
        found = await self._run(self.cursors.get, stream_id, name)
        return None if found is None else found[0]

    async def list_cursors(self, stream_id: int) -> dict[str, CursorPosition]:
        """Returns every cursor of the stream by name."""
        return await self._run(self.cursors.list, stream_id)

    async def commit_cursor(
        self, stream_id: int, name: str, entry_id: int, *, reset: bool = False
    ) -> CursorPosition:
        """Moves the cursor (see `CursorStore.commit`) and returns its new position."""
        return await self._run(self.cursors.commit, stream_id, name, entry_id, reset=reset)

    async def delete_cursor(self, stream_id: int, name: str) -> None:
        await self._run(self.cursors.delete, stream_id, name)

    async def available_bookies(self) -> list[BookieCandidate]:
        registrations = await self._run(self.registry.available)
        for bookie_id, registration in registrations.items():
            self._addresses[bookie_id] = registration.address
            self._data_addresses[bookie_id] = registration.data_address
        return [
            BookieCandidate(
                bookie_id,
                writable=not registration.read_only,
                journal=registration.journal_write_data,
                max_entry_bytes=registration.max_entry_bytes,
            )
            for bookie_id, registration in sorted(registrations.items())
        ]

    async def bookie_address(self, bookie_id: str) -> str | None:
        """Returns the registered address of `bookie_id` (cached; the registry is read again
        for an unknown id), None when it is not registered."""
        address = self._addresses.get(bookie_id)
        if address is None:
            await self.available_bookies()
            address = self._addresses.get(bookie_id)
        return address

    async def bookie_data_address(self, bookie_id: str, fresh: bool = False) -> str | None:
        """Returns the registered data port address of `bookie_id` (cached as
        `bookie_address`; `fresh`: read again), None when it is not registered or has no
        data port."""
        if fresh or bookie_id not in self._data_addresses:
            await self.available_bookies()
        return self._data_addresses.get(bookie_id) or None

    def watch_meta(
        self, stream_id: int, callback: Callable[[int | None], None]
    ) -> Callable[[], None]:
        loop = asyncio.get_running_loop()
        stopped = False
        handles: list[Any] = []

        def on_meta(meta: StreamMeta | None, version: int | None) -> bool | None:
            if stopped:
                return False
            if not loop.is_closed():
                loop.call_soon_threadsafe(callback, version)
            return None

        def start() -> None:
            # Setting a watch reads ZooKeeper: off the loop thread.
            handles.append(self.store.watch_meta(stream_id, on_meta))

        self._executor.submit(start)

        def stop() -> None:
            nonlocal stopped
            stopped = True
            for handle in handles:
                handle.stop()

        return stop

    def close(self) -> None:
        """Stops the thread pool (the session stays open)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
