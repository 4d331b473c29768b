"""The bookie's data port: Add streams over plain TCP (TLS when the bookie has it), framed by a
length, as BookKeeper's own data path is. gRPC costs about 300 us of CPU per Add message on
each side, most of it thread wake-ups per completion-queue event; a framed stream costs a
fraction of that (bench/grpc_add_bench.py, docs/benchmarks.md).

One connection is one Add stream, with the same messages and rules as gRPC's `Add`:
- the writer first sends `PREAMBLE` (the protocol and its version) and a frame holding the id
  of the bookie it means (a restarted bookie's port may since belong to another), then one
  frame per AddRequest (a 4-byte big-endian length, then the serialized request);
- the bookie answers each request with one frame, in request order: `ANSWER` followed by the
  serialized AddResponse (a request that does not parse is answered BAD_REQUEST, and the
  stream goes on);
- version 2 (`PREAMBLE`) differs from version 1 (`PREAMBLE_V1`) only in its answers: the ids
  of a batch with consecutive ids are named as a range (AddResponse.first_entry_id and
  entry_count, no entry_ids) and `codes` holds one code for all of them when they agree, so
  an answer costs the same whatever the batch's size. A bookie serves both versions;
- a fault of the connection itself (an unknown preamble, another bookie's id, a frame over the
  bookie's limit, a caller whose role may not add) is answered by one `REFUSAL` frame, its
  UTF-8 reason, and the bookie closes the connection: what was not answered has an unknown
  fate, as when a gRPC stream fails."""

from __future__ import annotations

import struct

# The protocol's name and version: a bookie refuses any other (another service). Writers send
# version 2; a bookie also serves version 1 (answers naming every id).
PREAMBLE = b"SKADD/2\n"
PREAMBLE_V1 = b"SKADD/1\n"
LENGTH = struct.Struct(">I")

# The first byte of an answer frame.
ANSWER = b"A"
REFUSAL = b"R"


def length_prefix(size: int) -> bytes:
    """Returns the header of a frame of `size` bytes."""
    return LENGTH.pack(size)


def frame(data: bytes) -> bytes:
    """Returns `data` framed."""
    return LENGTH.pack(len(data)) + data
