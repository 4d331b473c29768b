"""A raw client of a bookie's data port (stream.wire.frames), for the tests that send it what
a writer would not: blocking sockets, one frame at a time."""

from __future__ import annotations

import json
import socket
import ssl

from stream.sandbox.bookies import BookieProcess
from stream.wire import bookie_pb2 as pb
from stream.wire import frames


def data_address(bookie: BookieProcess) -> str:
    """The data port address `bookie` published at its last start ("" when it has none)."""
    served = [
        json.loads(line)
        for line in bookie.log_path.read_text().splitlines()
        if '"bookie.serving"' in line
    ]
    address: str = served[-1]["data_address"]
    return address


class RawDataPort:
    """One connection to a data port (TLS with `context`), nothing sent yet."""

    def __init__(self, address: str, context: ssl.SSLContext | None = None) -> None:
        host, port = address.rsplit(":", 1)
        raw = socket.create_connection((host, int(port)), timeout=10)
        self.sock = raw if context is None else context.wrap_socket(raw, server_hostname=host)

    def hello(self, bookie_id: str, preamble: bytes = frames.PREAMBLE) -> RawDataPort:
        """Sends the preamble (a writer's, unless told) and the bookie id."""
        self.send(preamble)
        self.frame(bookie_id.encode())
        return self

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frame(self, data: bytes) -> None:
        self.send(frames.frame(data))

    def add(self, request: pb.AddRequest) -> None:
        self.frame(request.SerializeToString())

    def _read(self, size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def _frame(self) -> tuple[bytes, bytes] | None:
        """The next frame's kind and body; None at the end."""
        head = self._read(frames.LENGTH.size)
        if head is None:
            return None
        (size,) = frames.LENGTH.unpack(head)
        body = self._read(size)
        assert body is not None, "the connection ended inside a frame"
        return body[:1], body[1:]

    def answer(self) -> pb.AddResponse | str | None:
        """The next frame: an AddResponse, a refusal's reason (str), None at the end."""
        frame = self._frame()
        if frame is None:
            return None
        kind, body = frame
        if kind == frames.ANSWER:
            return pb.AddResponse.FromString(body)
        assert kind == frames.REFUSAL, kind
        return body.decode()

    def read_answer(self) -> pb.ReadRangeResponse | None:
        """The answers of one range read, as one response (the entries of all, the code of
        the last); None if the connection ended first."""
        got = pb.ReadRangeResponse()
        while (frame := self._frame()) is not None:
            kind, body = frame
            if kind == frames.END:
                return got
            assert kind == frames.ANSWER, kind
            answer = pb.ReadRangeResponse.FromString(body)
            got.entries.extend(answer.entries)
            got.code = answer.code
        return None

    def close(self) -> None:
        self.sock.close()
