"""Sealing a stream: a takeover fixes its end, the final LAC is published, and the stream is
CASed SEALED (docs/design.md §5)."""

from __future__ import annotations

import random

from stream.client.explicit_lac import take_over_publishing_lac
from stream.client.options import WriterOptions
from stream.client.ports import BookieTransport, MetadataPort, WallClock
from stream.client.recovery import Takeover, WriterIdentity
from stream.errors import BadVersionError, InvalidTermError, MetadataError
from stream.logs import get_logger
from stream.metadata.model import StreamMeta, StreamState

log = get_logger(__name__)


async def seal(
    name: str,
    *,
    transport: BookieTransport,
    metadata: MetadataPort,
    clock: WallClock,
    rng: random.Random,
    options: WriterOptions,
    identity: WriterIdentity,
) -> StreamMeta:
    """Runs a takeover (the recovery fixes the end), publishes the final LAC to the last
    ensemble, then CASes the stream SEALED; returns the sealed meta."""
    result = await take_over_publishing_lac(
        Takeover(
            name,
            transport=transport,
            metadata=metadata,
            clock=clock,
            rng=rng,
            options=options,
            identity=identity,
        ),
        transport,
        options,
    )
    meta, version = result.meta, result.version
    for _ in range(options.cas_attempts):
        try:
            meta, _ = await metadata.set_state(meta.id, version, StreamState.SEALED)
            break
        except BadVersionError:
            meta, version, _ = await metadata.get_snapshot(meta.id)
            if meta.term != result.term:
                raise InvalidTermError(
                    "another writer took over before the stream was sealed",
                    term=result.term,
                    current_term=meta.term,
                    stream=name,
                ) from None
    else:
        raise MetadataError("sealing kept losing the CAS", stream=name)
    await metadata.unregister_writer(meta.id)
    log.info("recovery.sealed", stream=name, term=result.term, last_entry_id=result.last_entry_id)
    return meta
