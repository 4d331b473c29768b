"""What an append must pass before it is queued: a payload of bytes the bookies accept, checked
attributes, and for a producer writer a sequence its gate admits (docs/design.md §11). Nothing
is queued when a check fails: the writer stays usable."""

from __future__ import annotations

from stream.client.attributes import HeadersArg, check_headers, check_key
from stream.client.producer import ProducerGate
from stream.errors import InvalidArgumentError
from stream.framing.encoding import Headers
from stream.framing.prepare import AttributedPayload


def check_payload(payload: bytes, max_entry_bytes: int, stream: str) -> bytes:
    """Returns `payload` as bytes; raises `InvalidArgumentError` when it is not bytes-like or
    larger than the bookies accept (a bookie would answer BAD_REQUEST, which counts as its
    failure, and replacing every member fails the writer)."""
    if isinstance(payload, bytearray | memoryview):
        payload = bytes(payload)
    elif not isinstance(payload, bytes):
        raise InvalidArgumentError("payload must be bytes", type=type(payload).__name__)
    if len(payload) > max_entry_bytes:
        raise InvalidArgumentError(
            "entry larger than the bookies accept (their max_entry_bytes)",
            stream=stream,
            size=len(payload),
            max_entry_bytes=max_entry_bytes,
        )
    return payload


def with_attributes(
    payload: bytes,
    key: bytes | None,
    headers: HeadersArg | None,
    sequence: int | None,
    *,
    gate: ProducerGate | None,
    max_entry_bytes: int,
    stream: str,
) -> AttributedPayload:
    """Returns `payload` with its checked attributes and wire sequence (`wire_sequence`); a
    producer's duplicate comes back with wire sequence `-(entry id) - 2` (below zero, never
    queued). Raises `InvalidArgumentError`."""
    checked: Headers = ()
    if key is not None or headers:
        key, checked = check_key(key), check_headers(headers)
        size = len(payload) + len(key or b"")
        size += sum(len(name) + len(value) for name, value in checked)
        if size > max_entry_bytes:
            raise InvalidArgumentError(
                "entry with its key and headers larger than the bookies accept "
                "(their max_entry_bytes)",
                stream=stream,
                size=size,
                max_entry_bytes=max_entry_bytes,
            )
    return AttributedPayload(payload, key, checked, wire_sequence(gate, sequence, stream))


def wire_sequence(gate: ProducerGate | None, sequence: int | None, stream: str) -> int:
    """Returns the wire sequence of an append numbered `sequence` (0: none; the sequence + 1
    otherwise), or `-(entry id) - 2` for a producer's duplicate; raises `InvalidArgumentError`
    for a refused sequence, or one on a writer that is not a producer's (no `gate`)."""
    if gate is None:
        if sequence is not None:
            raise InvalidArgumentError(
                "sequence needs a producer writer (open_writer(..., producer_id=...))",
                stream=stream,
            )
        return 0
    duplicate_of = gate.admit(sequence)
    if duplicate_of is not None:
        return -duplicate_of - 2
    assert isinstance(sequence, int)
    return sequence + 1
