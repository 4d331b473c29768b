"""Argument types of `streamctl` options: a value that does not parse is a usage error (exit
code 2) naming the option, before anything connects."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from stream.errors import InvalidArgumentError

T = TypeVar("T")

# Entry ids are int64 on the wire and in the bookies' index.
MAX_ENTRY_ID = (1 << 63) - 1
_AN_ENTRY_ID = f"an entry id (a whole number from 0 to {MAX_ENTRY_ID})"


def _usage(parse: Callable[[str], T], name: str) -> Callable[[str], T]:
    """Returns `parse` as an argparse type: its `InvalidArgumentError` becomes the message."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except InvalidArgumentError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = name  # argparse names the type in some messages
    return convert


def _size(text: str) -> int:
    from stream.retention.units import parse_size

    return parse_size(text)


def _sizes(text: str) -> list[int]:
    values = [_size(v) for v in text.split(",") if v.strip()]
    if not values:
        raise InvalidArgumentError("expected a comma-separated list of sizes", value=text)
    return values


def _duration(text: str) -> float:
    from stream.retention.units import parse_duration

    return parse_duration(text)


def _entry_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_ENTRY_ID:
        raise InvalidArgumentError(f"expected {_AN_ENTRY_ID}", value=text)
    return value


def _start(text: str) -> str | int:
    if text in ("earliest", "latest"):
        return text
    try:
        return _entry_id(text)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"expected earliest, latest or {_AN_ENTRY_ID}", value=text
        ) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidArgumentError("expected a whole number >= 1", value=text)
    return value


def _header(text: str) -> tuple[str, bytes]:
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise InvalidArgumentError("expected name=value (a non-empty name)", value=text)
    return name, value.encode()


size = _usage(_size, "size")  # bytes: 64MiB, 10GB, 4096
sizes = _usage(_sizes, "sizes")  # 100,1KiB,16KiB
duration = _usage(_duration, "duration")  # seconds: 7d, 12h, 90m, 1.5, 500ms
entry_id = _usage(_entry_id, "entry id")
start_position = _usage(_start, "start")  # earliest | latest | entry id
positive_int = _usage(_positive_int, "count")
header = _usage(_header, "header")  # name=value, the value as UTF-8 bytes
