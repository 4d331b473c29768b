"""An Add batch read without a protobuf object per entry: the compiled scan
(`stream.framing.native.scan_add`) of the serialized AddRequest gives its header fields, the
entry ids, the payload bytes, the positions `_scan_entries` would list and each entry's bytes,
which the write cache stores as they came. It vouches only for a request in the form protobuf
writes (what writers send), where those bytes are exactly `Entry.SerializeToString` of the
parsed entry; any other request (and every request where the module is not built) is parsed
by protobuf as before, with its answers to malformed bytes.

The Python definition the scan is held to (tests/unit/bookie/test_native_scan_add.py) is what
the bookie does without it: protobuf's parse, `stream.bookie.storage.adds._scan_entries` and
`Entry.SerializeToString` of each entry."""

from __future__ import annotations

from typing import NamedTuple, TypeAlias

from stream.framing import native
from stream.wire import bookie_pb2 as pb

_parse_entry = pb.Entry.FromString
_scan = native.scan_add if native.BUILT else None


class ScannedAdd(NamedTuple):
    """An AddRequest as the compiled scan gives it (`raw`: the request as received). It has
    the header fields of `pb.AddRequest`, so the term rule, metrics and access checks read it
    as they read the message."""

    stream_id: int
    term: int
    lac: int
    lafr: int
    recovery: bool
    request_id: int
    ids: list[int]
    payload_bytes: int
    special: list[int]
    datas: list[bytes]
    raw: bytes

    @property
    def entries(self) -> list[pb.Entry]:
        """The entries as messages, parsed now: for the rare paths (refusals, audits, entries
        looked at closely), never per batch."""
        return list(map(_parse_entry, self.datas))


def parse_add(raw: bytes, max_entry_bytes: int) -> AddRequest:
    """Returns the received AddRequest `raw` scanned when the compiled scan vouches for it,
    else parsed by protobuf (which raises `DecodeError` on malformed bytes). `max_entry_bytes`
    is the bookie's limit (an entry above it is listed in `special`)."""
    if _scan is not None:
        scanned = _scan(raw, max_entry_bytes)
        if scanned is not None:
            return ScannedAdd(*scanned, raw)
    return pb.AddRequest.FromString(raw)


# An Add batch as the bookie serves it: scanned, or parsed by protobuf.
AddRequest: TypeAlias = "ScannedAdd | pb.AddRequest"


def entry_ids(request: AddRequest) -> list[int]:
    """Returns the ids of the batch's entries, in order."""
    if isinstance(request, ScannedAdd):
        return request.ids
    return [e.entry_id for e in request.entries]
