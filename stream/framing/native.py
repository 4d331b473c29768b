"""The compiled module (`_native`, built from _native.c by the package's own build,
docs/operations.md): the walker of ReadRange answers, the writer's entry framing
(`prepare_entries`), the bookie's scan of Add requests (`scan_add`) and its framing of range
answers (`frame_records`). `BUILT` says whether it was built. Callers fall back to the Python
definitions each is held to (`stream.client.entry.verified_columns`,
`stream.framing.prepare.prepare_entries_python`, `stream.bookie.storage.scanned`,
`stream.framing.range_answer.frame_records_python`), so a tree without it still works, only
slower; tests/unit/client/test_native_walk.py fails there."""

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
        frame_records,
        prepare_entries,
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
    "frame_records",
    "prepare_entries",
    "scan_add",
    "set_hardware_crc",
    "split_payloads",
    "walk_range",
]
