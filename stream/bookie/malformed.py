"""Requests malformed as a whole, answered BAD_REQUEST before anything else is looked at: one
function per RPC, returning why (the answer's message) or None. The entries of an Add batch are
checked by the storage engine."""

from __future__ import annotations

from stream.bookie.storage.scanned import AddRequest
from stream.wire import bookie_pb2 as pb


def malformed_add(request: AddRequest) -> str | None:
    if request.stream_id == 0:
        return "stream_id 0 is not a stream"
    if request.term == 0:
        return "an add needs a term >= 1"
    if request.lac < -1 or request.lafr < -1:
        return f"lac {request.lac} / lafr {request.lafr} below -1"
    return None


def malformed_fence(request: pb.FenceRequest) -> str | None:
    if request.stream_id == 0 or request.term == 0:
        return "Fence needs a stream_id and a term >= 1"
    return None


def malformed_read(request: pb.ReadRequest) -> str | None:
    if request.stream_id == 0 or request.entry_id < 0:
        return "Read needs a stream_id and an entry_id >= 0"
    return None


def malformed_read_lac(request: pb.ReadLacRequest) -> str | None:
    if request.stream_id == 0 or request.known_lac < -1:
        return "ReadLac needs a stream_id and a known_lac >= -1"
    return None


def malformed_truncate(request: pb.TruncateRequest) -> str | None:
    if request.stream_id == 0 or request.term == 0 or request.after_entry_id < -1:
        return "Truncate needs a stream_id, a term >= 1 and an after_entry_id >= -1"
    return None


def malformed_trim(request: pb.TrimRequest) -> str | None:
    if request.stream_id == 0 or request.before_entry_id < 0:
        return "Trim needs a stream_id and a before_entry_id >= 0"
    return None


def malformed_stream_state(request: pb.StreamStateRequest) -> str | None:
    if request.stream_id == 0:
        return "stream_id 0 is not a stream"
    return None


def malformed_read_range(request: pb.ReadRangeRequest) -> str | None:
    if (
        request.stream_id == 0
        or request.first_entry_id < 0
        or request.last_entry_id < request.first_entry_id
    ):
        return "ReadRange needs a stream_id and 0 <= first_entry_id <= last_entry_id"
    return None
