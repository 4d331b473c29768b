"""The compiled walker of ReadRange answers (`_native`, built from _native.c by the package's
own build, docs/operations.md), where it was built: `BUILT` says whether it was; with the
bookie's scan of Add requests (`scan_add`). Callers fall back to the Python definitions they
are held to (`stream.client.entry.verified_columns`, `stream.bookie.storage.scanned`), so a
tree without it still works, only slower; tests/unit/client/test_native_walk.py and
tests/unit/bookie/test_native_scan_add.py fail there."""

from __future__ import annotations

from array import array
from typing import TypeAlias

# What the walker's columns are held in (anything with the buffer protocol).
Buffer: TypeAlias = "bytes | bytearray | memoryview | array[int]"

try:
    from stream.framing._native import (
        DEFER,
        DONE,
        FALLBACK,
        FLAG_ATTRIBUTES,
        FLAG_NOOP,
        crc32c,
        scan_add,
        set_hardware_crc,
        split_payloads,
        walk_range,
    )

    BUILT = True
except ImportError:  # not built (a source tree without `setup.py build_ext --inplace`)
    BUILT = False

__all__ = [
    "BUILT",
    "DEFER",
    "DONE",
    "FALLBACK",
    "FLAG_ATTRIBUTES",
    "FLAG_NOOP",
    "Buffer",
    "crc32c",
    "scan_add",
    "set_hardware_crc",
    "split_payloads",
    "walk_range",
]
