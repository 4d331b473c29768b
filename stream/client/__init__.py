"""The Streamkeeper client: `StreamClient` (the synchronous API of docs/design.md §5) and its
asyncio core (writer, reader, recovery) behind the ports of `stream.client.ports`."""

from stream.client.client import StreamClient, StreamReader, StreamWriter
from stream.client.cursor import Cursor
from stream.client.entries import BookieStatus, Entry, EntryColumns, Fragment, StreamInfo
from stream.client.options import Protections, ReaderOptions, WriterOptions
from stream.metadata.cursors import CursorLag
from stream.metadata.model import RetentionPolicy
from stream.security.tls import TLSConfig

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
