"""The compiled module (`_native`, built from _native.c by the package's own build,
docs/operations.md): the walker of ReadRange answers, the writer's entry framing
(`prepare_entries`), the bookie's scan of Add requests (`scan_add`), its locating of a range's
records (`index_runs`), its framing of range answers (`frame_spans`) and of entry-log records
(`log_records`), a reader's receive buffers (`sized_buffer`), and crc32c itself
(`crc32c`; the crc32c package's function where the module was not built: every hot path takes
it from here). `BUILT` says whether it was built. Callers fall back to the Python definitions
each is held to (`stream.client.entry.verified_columns`,
`stream.framing.prepare.prepare_entries_python`, `stream.bookie.storage.scanned`,
`stream.framing.range_answer.frame_spans_python`,
`stream.bookie.storage.locations.index_runs_python`,
`stream.bookie.storage.entry_log.log_records_python`,
`stream.client.answer_buffers.sized_buffer_python`), so a tree without it still works, only
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
        frame_spans,
        index_runs,
        log_records,
        prepare_entries,
        scan_add,
        set_hardware_crc,
        sized_buffer,
        split_payloads,
        walk_range,
    )

    BUILT = True
except ImportError:  # not built (a source tree without `setup.py build_ext --inplace`)
    BUILT = False
    # The crc32c package's function, the same checksum. Where the module is built, the
    # package is never imported: its import costs a process about 12 ms (its version lookup
    # through importlib.metadata, and argparse), as much as the rest of stream.protocol.
    from crc32c import crc32c

__all__ = [
    "BUILT",
    "DEFER",
    "DONE",
    "FALLBACK",
    "FLAG_ATTRIBUTES",
    "FLAG_NOOP",
    "Buffer",
    "crc32c",
    "frame_spans",
    "index_runs",
    "log_records",
    "prepare_entries",
    "scan_add",
    "set_hardware_crc",
    "sized_buffer",
    "split_payloads",
    "walk_range",
]
