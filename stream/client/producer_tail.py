"""What a takeover learns of the previous producer term (docs/design.md §11): that term's last
sequenced entry, read back from the end of the recovered tail, and the metadata change that
folds it into the producer table and names the new term's producer."""

from __future__ import annotations

from collections.abc import Sequence

from stream.client.ports import BookieTransport
from stream.errors import StreamError
from stream.framing.verify import checksum_ok
from stream.logs import get_logger
from stream.metadata.model import ProducerChange, ProducerTerm, StreamMeta
from stream.protocol import Code, EntryFlag, ensemble_for
from stream.protocol.producers import DEFAULT_PRODUCER_EXPIRY_MS, ProducerPosition, TailAnchor
from stream.wire import bookie_pb2 as pb

log = get_logger(__name__)

_NOOP = int(EntryFlag.NOOP)
_OK = int(Code.OK)  # an int: the answers carry the wire's own Code type


async def last_sequenced_entry(
    transport: BookieTransport,
    meta: StreamMeta,
    fragments: Sequence[tuple[int, Sequence[str]]],
    first_entry_id: int,
    last_entry_id: int,
    *,
    timeout_s: float,
) -> TailAnchor | None:
    """Returns the last entry in `[first_entry_id, last_entry_id]` that carries a sequence, as
    an anchor of the run starting at `first_entry_id`; None when there is none. Reads backwards
    from `last_entry_id`, past no-ops (those of takeovers that died before their metadata
    change), with term-bearing reads: the entries are committed once the takeover's no-op is.
    Raises `StreamError` when no member of an entry's write set gives it."""
    for entry_id in range(last_entry_id, first_entry_id - 1, -1):
        entry = await _read_entry(transport, meta, fragments, entry_id, timeout_s)
        if entry.flags & _NOOP:
            continue
        if entry.sequence > 0:
            return TailAnchor(entry.sequence - 1, entry_id, first_entry_id)
        return None  # an unnumbered entry: that term wrote no sequences after it
    return None


async def _read_entry(
    transport: BookieTransport,
    meta: StreamMeta,
    fragments: Sequence[tuple[int, Sequence[str]]],
    entry_id: int,
    timeout_s: float,
) -> pb.Entry:
    ensemble = ensemble_for(fragments, entry_id)
    for bookie_id in meta.quorum.write_set_bookies(ensemble, entry_id):
        try:
            response = await transport.read(
                bookie_id, meta.id, entry_id, term=meta.term, timeout_s=timeout_s
            )
        except Exception as e:  # any failure is an unknown answer: ask the next member
            log.debug("producers.tail_read_failed", bookie=bookie_id, error=str(e))
            continue
        if (
            response.code == _OK
            and response.entry.entry_id == entry_id
            and checksum_ok(meta.id, response.entry)
        ):
            return response.entry
    raise StreamError(
        "no bookie gave an entry of the previous producer term", stream=meta.name, entry_id=entry_id
    )


def takeover_change(
    meta: StreamMeta,
    anchor: TailAnchor | None,
    producer_id: str | None,
    first_of_term: int,
    now_ms: int,
    expiry_ms: int = DEFAULT_PRODUCER_EXPIRY_MS,
) -> ProducerChange | None:
    """Returns the metadata change a takeover of `meta`'s term makes for producers: the previous
    producer term's last entry (`anchor`) folded in, and `producer_id`'s term from
    `first_of_term`; None when neither term is a producer's (nothing to record)."""
    previous = meta.producer_term
    if previous is None and producer_id is None:
        return None
    positions: tuple[ProducerPosition, ...] = ()
    if previous is not None and anchor is not None:
        positions = (
            ProducerPosition(previous.producer_id, anchor.sequence, anchor.entry_id, now_ms),
        )
    term = None if producer_id is None else ProducerTerm(meta.term, producer_id, first_of_term)
    return ProducerChange(positions, now_ms, expiry_ms, term)
