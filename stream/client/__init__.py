"""The Streamkeeper client: `StreamClient` (the synchronous API of docs/design.md §5) and its
asyncio core (writer, reader, recovery) behind the ports of `stream.client.ports`.

The names below load their module on first use (PEP 562), so importing a module of the core,
`stream.client.writer` say, loads neither the facade nor grpc and kazoo."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stream.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from stream.client.client import StreamClient, StreamReader, StreamWriter
    from stream.client.cursor import Cursor
    from stream.client.entry import Entry, EntryColumns
    from stream.client.info import BookieStatus, StreamInfo
    from stream.client.info import FragmentInfo as Fragment
    from stream.client.options import Protections, ReaderOptions, WriterOptions
    from stream.metadata.lag import CursorLag
    from stream.metadata.model import RetentionPolicy
    from stream.security.tls import TLSConfig

# name -> the module that defines it (":name there" where that differs). `Fragment` is the name
# docs/design.md §5 gives `stream_info`'s fragments; inside the package it is `FragmentInfo`,
# apart from the metadata's `Fragment`.
_SOURCES = {
    "BookieStatus": "stream.client.info",
    "Cursor": "stream.client.cursor",
    "CursorLag": "stream.metadata.lag",
    "Entry": "stream.client.entry",
    "EntryColumns": "stream.client.entry",
    "Fragment": "stream.client.info:FragmentInfo",
    "Protections": "stream.client.options",
    "ReaderOptions": "stream.client.options",
    "RetentionPolicy": "stream.metadata.model",
    "StreamClient": "stream.client.client",
    "StreamInfo": "stream.client.info",
    "StreamReader": "stream.client.client",
    "StreamWriter": "stream.client.client",
    "TLSConfig": "stream.security.tls",
    "WriterOptions": "stream.client.options",
}

__all__ = [
    "BookieStatus",
    "Cursor",
    "CursorLag",
    "Entry",
    "EntryColumns",
    "Fragment",
    "Protections",
    "ReaderOptions",
    "RetentionPolicy",
    "StreamClient",
    "StreamInfo",
    "StreamReader",
    "StreamWriter",
    "TLSConfig",
    "WriterOptions",
]

__getattr__ = lazy_exports(__name__, _SOURCES)
