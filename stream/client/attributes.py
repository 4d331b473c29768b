"""The key and headers an application appends with, checked and normalised."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from stream.errors import InvalidArgumentError
from stream.framing.encoding import NO_HEADERS, Headers

# What an application may pass as headers: pairs (names may repeat) or a mapping.
HeadersArg = Iterable[tuple[str, bytes]] | Mapping[str, bytes]


def check_headers(headers: HeadersArg | None) -> Headers:
    """Returns `headers` (pairs or a mapping of str names to bytes-like values) as `Headers`;
    raises `InvalidArgumentError` when a name is not a str or a value not bytes-like."""
    if not headers:
        return NO_HEADERS
    try:
        pairs = list(headers.items() if isinstance(headers, Mapping) else headers)
    except TypeError:
        raise InvalidArgumentError(
            "headers must be (name, value) pairs or a mapping", type=type(headers).__name__
        ) from None
    checked = []
    for pair in pairs:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise InvalidArgumentError("a header must be a (name, value) pair", header=repr(pair))
        name, value = pair
        if not isinstance(name, str):
            raise InvalidArgumentError("a header name must be a str", name=repr(name))
        if not isinstance(value, bytes | bytearray | memoryview):
            raise InvalidArgumentError(
                "a header value must be bytes", name=name, type=type(value).__name__
            )
        checked.append((name, bytes(value)))
    return tuple(checked)


def check_key(key: bytes | None) -> bytes | None:
    """Returns `key` as bytes (None stays None); raises `InvalidArgumentError` when it is not
    bytes-like."""
    if key is None or type(key) is bytes:
        return key
    if not isinstance(key, bytearray | memoryview):
        raise InvalidArgumentError("key must be bytes", type=type(key).__name__)
    return bytes(key)
