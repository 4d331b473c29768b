"""The Streamkeeper client: `StreamClient` (the synchronous API of docs/design.md §5) and its
asyncio core (writer, reader, recovery) behind the ports of `stream.client.ports`.

The names below load their module on first use (PEP 562), so importing a module of the core,
`stream.client.writer` say, loads neither the facade nor grpc and kazoo."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

# name -> (the module that defines it, its name there). `Fragment` is the name docs/design.md
# §5 gives `stream_info`'s fragments; inside the package it is `FragmentInfo`, apart from the
# metadata's `Fragment`.
_SOURCES = {
    "BookieStatus": ("stream.client.info", "BookieStatus"),
    "Cursor": ("stream.client.cursor", "Cursor"),
    "CursorLag": ("stream.metadata.lag", "CursorLag"),
    "Entry": ("stream.client.entry", "Entry"),
    "EntryColumns": ("stream.client.entry", "EntryColumns"),
    "Fragment": ("stream.client.info", "FragmentInfo"),
    "Protections": ("stream.client.options", "Protections"),
    "ReaderOptions": ("stream.client.options", "ReaderOptions"),
    "RetentionPolicy": ("stream.metadata.model", "RetentionPolicy"),
    "StreamClient": ("stream.client.client", "StreamClient"),
    "StreamInfo": ("stream.client.info", "StreamInfo"),
    "StreamReader": ("stream.client.client", "StreamReader"),
    "StreamWriter": ("stream.client.client", "StreamWriter"),
    "TLSConfig": ("stream.security.tls", "TLSConfig"),
    "WriterOptions": ("stream.client.options", "WriterOptions"),
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


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(source[0]), source[1])
    globals()[name] = value
    return value
