"""Trimming and deleting a stream, as async functions over the ports: `StreamClient.trim` and
`StreamClient.delete_stream` run them on their loop thread, and the simulator runs the very
same code on its virtual-time loop (so a random run deletes and trims as the shipping client
does).
"""

from __future__ import annotations

import asyncio

from stream.client.ports import BookieTransport, MetadataPort
from stream.errors import BadVersionError, StreamError, StreamInUseError
from stream.logs import get_logger

log = get_logger(__name__)

# `Trim` below this drops every entry of a stream (its deletion).
TRIM_ALL = (1 << 63) - 1
BOOKIE_CALL_TIMEOUT_S = 5.0
_CAS_ATTEMPTS = 16


async def trim_stream(
    metadata: MetadataPort,
    transport: BookieTransport,
    name: str,
    before_entry_id: int,
    *,
    timeout_s: float = BOOKIE_CALL_TIMEOUT_S,
) -> int:
    """Deletes the whole non-last fragments holding only entries below `before_entry_id`,
    moves the first retained entry to the first fragment kept, tells their bookies to
    `Trim`, and returns the new first retained entry id."""
    meta, _ = await metadata.get_stream(name)
    for _ in range(_CAS_ATTEMPTS):
        meta, version, fragments = await metadata.get_snapshot(meta.id)
        doomed = []
        for index, fragment in enumerate(fragments[:-1]):
            end = fragment.last_entry_id
            if end is None:
                end = fragments[index + 1].first_entry_id - 1
            if end >= before_entry_id:
                break
            doomed.append(fragment)
        if not doomed:
            return meta.first_entry_id
        new_first = fragments[len(doomed)].first_entry_id
        try:
            await metadata.trim_fragments(
                meta.id, version, [f.first_entry_id for f in doomed], new_first
            )
            break
        except BadVersionError:
            continue
    else:
        raise StreamError("trim kept losing the metadata CAS", stream=name)
    bookies = sorted({b for f in doomed for b in f.ensemble})
    await trim_bookies(transport, meta.id, bookies, new_first, timeout_s=timeout_s)
    log.info("client.trimmed", stream=name, first_entry_id=new_first, fragments=len(doomed))
    return new_first


async def delete_stream(
    metadata: MetadataPort,
    transport: BookieTransport,
    name: str,
    *,
    force: bool = False,
    timeout_s: float = BOOKIE_CALL_TIMEOUT_S,
) -> None:
    """Deletes the stream's metadata, then asks its bookies to drop its entries. A stream
    with a live writer raises `StreamInUseError` unless `force` (that writer then fails
    with `StreamNotFoundError`)."""
    meta, _ = await metadata.get_stream(name)
    writer = None if force else await metadata.get_writer(meta.id)
    if writer is not None:
        raise StreamInUseError(
            "stream has a live writer; nothing was deleted "
            "(force=True, or streamctl delete --force, deletes it under the writer)",
            stream=name,
            writer=writer.writer_id,
            host=writer.host,
            pid=writer.pid,
        )
    _, _, fragments = await metadata.get_snapshot(meta.id)
    await metadata.delete_stream(name)
    bookies = sorted({b for f in fragments for b in f.ensemble})
    await trim_bookies(transport, meta.id, bookies, TRIM_ALL, timeout_s=timeout_s)


async def trim_bookies(
    transport: BookieTransport,
    stream_id: int,
    bookies: list[str],
    before: int,
    *,
    timeout_s: float = BOOKIE_CALL_TIMEOUT_S,
) -> None:
    """Asks each of `bookies` to `Trim` the stream below `before`; one that does not answer
    is left to its GC, which reconciles with metadata later."""

    async def one(bookie_id: str) -> None:
        try:
            await transport.trim(bookie_id, stream_id, before, timeout_s=timeout_s)
        except Exception as e:  # the bookie's GC reconciles with metadata later
            log.info("client.trim_not_delivered", bookie=bookie_id, error=repr(e))

    await asyncio.gather(*(one(b) for b in bookies))
