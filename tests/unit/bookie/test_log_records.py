"""The flush's records (stream/bookie/storage/entry_log.py): the compiled `log_records`
(_native.c) against its Python definition over random slices, both refusing what does not fit
the format, and a flush through `EntryLogs` reading back what it wrote, with and without the
compiled module."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from stream.bookie.storage import entry_log
from stream.bookie.storage.codec import ENTRY_KEY, ENTRY_RECORD_HEADER, LOCATION
from stream.bookie.storage.entry_log import EntryLogs, log_records_python
from stream.framing import native

pytestmark = pytest.mark.skipif(not native.BUILT, reason="the compiled module is not built")


def _random_slice(rng: random.Random) -> tuple[int, list[int], list[bytes], int, int]:
    stream_id = rng.choice([0, 1, rng.getrandbits(64)])
    first = rng.choice([0, rng.getrandbits(63)])
    count = rng.choice([0, 1, 2, 9, 300])
    ids = [first + i for i in range(count)]
    if rng.random() < 0.3:  # gaps: a stream's cached ids need not be consecutive
        ids = sorted(rng.sample(range(first, first + 4 * count + 1), count))
    datas = [rng.randbytes(rng.choice([0, 1, 100, 1024, rng.randrange(5000)])) for _ in ids]
    log_id = rng.choice([0, 1, 0xFFFFFFFF, rng.getrandbits(32)])
    offset = rng.choice([16, rng.getrandbits(40)])
    return stream_id, ids, datas, log_id, offset


@pytest.mark.parametrize("seed", range(5))
def test_the_compiled_records_are_the_python_definition(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(60):
        args = _random_slice(rng)
        expected = log_records_python(*args)
        assert native.log_records(*args) == expected
        stream_id, ids, datas, log_id, offset = args
        # Other bytes-like entries and sequences give the same.
        others = [bytearray(d) if i % 2 else memoryview(d) for i, d in enumerate(datas)]
        assert native.log_records(stream_id, tuple(ids), others, log_id, offset) == expected
        keys, locations, records = expected
        assert keys == [ENTRY_KEY.pack(stream_id, i) for i in ids]
        position = offset
        for data, location in zip(datas, locations, strict=True):
            header = records[position - offset : position - offset + ENTRY_RECORD_HEADER.size]
            assert ENTRY_RECORD_HEADER.unpack(header) == (len(data), stream_id)
            assert LOCATION.unpack(location) == (log_id, position + 12, len(data))
            position += ENTRY_RECORD_HEADER.size + len(data)
        assert len(records) == position - offset


@pytest.mark.parametrize(
    "args",
    [
        (-1, [1], [b"x"], 0, 16),  # a stream id below 0
        (1 << 64, [1], [b"x"], 0, 16),  # over 64 bits
        (1, [-1], [b"x"], 0, 16),  # an entry id below 0
        (1, [1], [b"x"], 1 << 32, 16),  # a log id over 32 bits
        (1, [1], [b"x"], 0, -13),  # an offset below 0
        (1, [1, 2], [b"x"], 0, 16),  # ids and entries differ in number
        (1, [1], ["x"], 0, 16),  # not bytes-like
        (1, [1], [b"x"], 0, (1 << 64) - 5),  # an offset past 64 bits
    ],
)
def test_both_refuse_what_the_format_cannot_hold(args: tuple[object, ...]) -> None:
    with pytest.raises((OverflowError, ValueError, TypeError, struct.error)):
        log_records_python(*args)  # type: ignore[arg-type]
    with pytest.raises((OverflowError, ValueError, TypeError)):
        native.log_records(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize("compiled", [True, False])
def test_a_flush_reads_back_across_a_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiled: bool
) -> None:
    if not compiled:
        monkeypatch.setattr(entry_log, "_log_records", log_records_python)
    rng = random.Random(7)
    logs = EntryLogs(tmp_path, size_limit_bytes=64 << 10)
    logs.open()
    try:
        streams = []
        for stream_id in (3, 9):
            ids = list(range(10, 2_500))
            streams.append((stream_id, ids, [rng.randbytes(rng.randrange(80)) for _ in ids]))
        with logs.lock:
            keys, locations, written = logs.write_entries(streams)
            logs.sync()
        assert written == sum(12 + len(d) for _, _, datas in streams for d in datas)
        expected = [(s, i, d) for s, ids, datas in streams for i, d in zip(ids, datas, strict=True)]
        assert keys == [ENTRY_KEY.pack(s, i) for s, i, _ in expected]
        assert len({LOCATION.unpack(loc)[0] for loc in locations}) > 1  # it rotated
        for (_, _, data), location in zip(expected, locations, strict=True):
            assert logs.read_span(*LOCATION.unpack(location)) == data
    finally:
        logs.close()
