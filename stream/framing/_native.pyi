# The compiled walker (_native.c); see stream/framing/native.py.
from collections.abc import Sequence
from typing import Final, TypeVar

T = TypeVar("T", bound=tuple[object, ...])

DONE: Final[int]
DEFER: Final[int]
FALLBACK: Final[int]
FLAG_NOOP: Final[int]
FLAG_ATTRIBUTES: Final[int]

def walk_range(
    answer: bytes | bytearray | memoryview,
    stream_id: int,
    first: int,
    accepted: int,
    stopped: bool,
    position: int,
    code: int,
    entries: int,
    ids: bytearray,
    timestamps: bytearray,
    offsets: bytearray,
    data: bytearray,
    /,
) -> tuple[int, int, int, bool, int, int, int, int]: ...
def split_payloads(offsets: object, data: object, /) -> list[bytes]: ...
def crc32c(data: bytes | bytearray | memoryview, value: int = 0, /) -> int: ...
def set_hardware_crc(on: bool, /) -> bool: ...
def scan_add(
    request: bytes | bytearray | memoryview, max_entry_bytes: int, /
) -> tuple[int, int, int, int, bool, int, list[int], int, list[int], list[bytes]] | None: ...
def prepare_entries(
    stream_id: int,
    first_entry_id: int,
    timestamp_ms: int,
    payloads: list[bytes],
    cls: type[T],
    /,
) -> list[T]: ...
def frame_spans(
    spans: Sequence[tuple[bytes | bytearray | memoryview, int, Sequence[int], Sequence[int]]],
    tag: int,
    head: bytes | bytearray | memoryview,
    /,
) -> bytes: ...
def index_runs(
    located: list[bytes], budget: int, header: int, /
) -> tuple[int, list[tuple[int, int, tuple[int, ...], tuple[int, ...]]]]: ...
def log_records(
    stream_id: int,
    entry_ids: Sequence[int],
    datas: Sequence[bytes | bytearray | memoryview],
    log_id: int,
    offset: int,
    /,
) -> tuple[list[bytes], list[bytes], bytes]: ...
def sized_buffer(buffer: bytearray | None, size: int, /) -> bytearray: ...
