"""One ReadRange answer as the reader uses it: the run of entries it accepts (the rule of
`verified_columns`) as columns, how many entries the answer held, and its code. A serialized
answer (what the gRPC transport hands over) is walked by the compiled walker
(`stream.framing.native`): no protobuf message and no Python object per entry, the columns
packed as Arrow lays them out. A message, or a serialized answer where the walker is not
built, goes through protobuf and `verified_columns`, the definition the walker is held to."""

from __future__ import annotations

import struct
from typing import NamedTuple

from stream.client.answer_buffers import AnswerBuffers
from stream.client.entry import EntryColumns, PackedColumns, verified_columns
from stream.framing import native
from stream.framing.encoding import Attributes
from stream.wire import bookie_pb2 as pb

_pack_int64 = struct.Struct("=q").pack
_pack_int32 = struct.Struct("=i").pack  # raises past 2 GiB of payloads, as the walker does
_U64_END = 1 << 64
_I64_END = 1 << 63

# Test-only switch: False sends serialized answers through protobuf and `verified_columns`,
# as where the walker is not built.
use_walker = native.BUILT


class RangeAnswer(NamedTuple):
    """What the reader takes from one ReadRange answer: `columns` (the accepted entries, no-ops
    left out), `accepted` (how many entries of the run from the id asked for it accepts, no-ops
    counted), `entries` (how many the answer held) and `code`."""

    columns: EntryColumns
    accepted: int
    entries: int
    code: int


def range_answer(
    stream_id: int,
    first_entry_id: int,
    answer: bytes | pb.ReadRangeResponse,
    buffers: AnswerBuffers | None = None,
) -> RangeAnswer:
    """Returns what the reader takes from `answer` (serialized or a message), a ReadRange
    answer of stream `stream_id` from entry `first_entry_id`, its payload column from
    `buffers` where given. A malformed serialized answer raises protobuf's `DecodeError`, as
    decoding it in the transport would."""
    if isinstance(answer, pb.ReadRangeResponse):
        return _from_message(stream_id, first_entry_id, answer)
    if use_walker and 0 <= stream_id < _U64_END and -_I64_END <= first_entry_id < _I64_END:
        walked = _walk(stream_id, first_entry_id, answer, buffers)
        if walked is not None:
            return walked
    return _from_message(stream_id, first_entry_id, pb.ReadRangeResponse.FromString(answer))


def _from_message(
    stream_id: int, first_entry_id: int, response: pb.ReadRangeResponse
) -> RangeAnswer:
    columns = EntryColumns.empty()
    accepted = verified_columns(stream_id, first_entry_id, response.entries, *columns)
    return RangeAnswer(columns, accepted, len(response.entries), response.code)


def _walk(
    stream_id: int, first_entry_id: int, answer: bytes, buffers: AnswerBuffers | None = None
) -> RangeAnswer | None:
    """Walks `answer` with the compiled walker; None when it leaves the whole answer to
    protobuf (FALLBACK). The entries it leaves to the Python definition (DEFER: flag
    ATTRIBUTES, fields besides the plain five) are decoded one by one and checked here. The
    payload column, as large as the answer at most, comes from `buffers` where given."""
    ids, stamps, offsets = bytearray(), bytearray(), bytearray(4)
    data = bytearray() if buffers is None else buffers.take(0, len(answer))
    attributes: dict[int, Attributes] = {}
    position = accepted = code = entries = 0
    stopped = False
    walk = native.walk_range
    while True:
        status, position, accepted, stopped, code, entries, start, end = walk(
            answer,
            stream_id,
            first_entry_id,
            accepted,
            stopped,
            position,
            code,
            entries,
            ids,
            stamps,
            offsets,
            data,
        )
        if status == native.DONE:
            packed = PackedColumns(ids, stamps, offsets, data)
            return RangeAnswer(
                EntryColumns.from_packed(packed, attributes), accepted, entries, code
            )
        if status == native.FALLBACK:
            return None
        entry = pb.Entry.FromString(answer[start:end])  # DecodeError: the answer is malformed
        if stopped:
            continue  # past the run: decoded only to find a malformed answer, as protobuf would
        one = EntryColumns.empty()
        if not verified_columns(stream_id, first_entry_id + accepted, (entry,), *one):
            stopped = True
            continue
        accepted += 1
        if one.ids:  # not a no-op
            if one.attributes:
                attributes[len(ids) // 8] = one.attributes[0]
            ids += _pack_int64(entry.entry_id)
            stamps += _pack_int64(entry.timestamp_ms)
            data += entry.payload
            offsets += _pack_int32(len(data))
