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

    def hello(self, bookie_id: str) -> RawDataPort:
        """Sends the preamble and the bookie id, as a writer does."""
        self.send(frames.PREAMBLE)
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

    def answer(self) -> pb.AddResponse | str | None:
        """The next frame: an AddResponse, a refusal's reason (str), None at the end."""
        head = self._read(frames.LENGTH.size)
        if head is None:
            return None
        (size,) = frames.LENGTH.unpack(head)
        body = self._read(size)
        assert body is not None, "the connection ended inside a frame"
        if body[:1] == frames.ANSWER:
            return pb.AddResponse.FromString(body[1:])
        assert body[:1] == frames.REFUSAL, body[:1]
        return body[1:].decode()

    def close(self) -> None:
        self.sock.close()
