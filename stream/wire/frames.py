"""The bookie's data port: Add streams and range reads over plain TCP (TLS when the bookie has
it), framed by a length, as BookKeeper's own data path is. gRPC costs about 300 us of CPU per
Add message on each side, most of it thread wake-ups per completion-queue event; a framed
stream costs a fraction of that (bench/grpc_add_bench.py, docs/benchmarks.md). A range read's
answers (up to megabytes each) are copied twice more by gRPC on each side, and sent by its own
thread; framed, each is received straight into a buffer of its size.

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
  fate, as when a gRPC stream fails.

A connection that opens with `READ_PREAMBLE_V1` (then the bookie id, as above) carries ReadRange
requests instead, with the same messages and rules as gRPC's `ReadRange`:
- the reader sends one frame per ReadRangeRequest; the bookie serves them one at a time, in
  order;
- each request is answered by one `ANSWER` frame per ReadRangeResponse (the last one carries the
  code that ended the range), then one `END` frame with no body (where gRPC ends the call);
- a fault of the connection is answered by one `REFUSAL` frame, as above. A bookie older than
  this version refuses the preamble so: the reader then reads that bookie over gRPC.

Version 2 of the reads (`READ_PREAMBLE`; a bookie also serves `READ_PREAMBLE_V1`, above) carries
ReadLac requests too, so that a reader never needs a gRPC channel (whose library a short-lived
process, such as a Spark query's source runner, would otherwise import only to learn the LAC):
- each request frame's body starts with its kind, `READ_RANGE` (then the ReadRangeRequest) or
  `READ_LAC` (then the ReadLacRequest, with gRPC's `ReadLac` rules: the caller's role is
  checked for it, and a long poll holds the connection until it is answered);
- a ReadLac is answered by one `ANSWER` frame (the ReadLacResponse), then `END`, as a range is;
- a request of another kind is a fault of the connection (`REFUSAL`)."""

from __future__ import annotations

import contextlib
import socket
import struct

# The protocol's name and version: a bookie refuses any other (another service). Writers send
# version 2; a bookie also serves version 1 (answers naming every id).
PREAMBLE = b"SKADD/2\n"
PREAMBLE_V1 = b"SKADD/1\n"
# A connection of ReadRange and ReadLac requests (as long as the Add preambles); version 1
# carries ReadRange requests alone, without the kind byte.
READ_PREAMBLE = b"SKRNG/2\n"
READ_PREAMBLE_V1 = b"SKRNG/1\n"
# The first byte of a version 2 request frame's body.
READ_RANGE = b"R"
READ_LAC = b"L"
LENGTH = struct.Struct(">I")

# The first byte of an answer frame.
ANSWER = b"A"
REFUSAL = b"R"
END = b"E"  # a range's last frame

# How a refusal of an unknown preamble begins (so bookies of every release have said it, before
# taking any frame): a client newer than its bookie falls back on it.
UNKNOWN_PREAMBLE = "not a data port client"


def length_prefix(size: int) -> bytes:
    """Returns the header of a frame of `size` bytes."""
    return LENGTH.pack(size)


def frame(data: bytes) -> bytes:
    """Returns `data` framed."""
    return LENGTH.pack(len(data)) + data


def tune(sock: socket.socket | None, keepalive: tuple[int, int, int]) -> None:
    """Sets TCP_NODELAY and TCP keepalive (`keepalive`: idle seconds, seconds between probes,
    probes) on a data port connection's socket. asyncio sets TCP_NODELAY only on sockets whose
    `proto` is IPPROTO_TCP, and `socket.create_server`'s (so its accepted ones') is 0: with
    Nagle on, an answer written while the previous one was unacknowledged waited for the
    writer's next batch to carry the ACK (measured: 17 ms round trips in runs of seconds at
    15,000 appends/s, the p99 at 37 ms)."""
    if sock is None:
        return
    idle, interval, count = keepalive
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
