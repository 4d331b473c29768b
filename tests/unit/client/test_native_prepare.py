"""The compiled `prepare_entries` (_native.c) against its Python definition
(`prepare_entries_python`): the same PreparedEntry tuples, byte for byte, over random runs
with entry ids and timestamps around every varint length, empty and large payloads, and
bytes-like payloads; and the writer still prepares entries without it."""

from __future__ import annotations

import random

import pytest

from stream.framing import native, prepare
from stream.framing.prepare import PreparedEntry, prepare_entries, prepare_entries_python
from stream.wire import bookie_pb2 as pb

I63 = (1 << 63) - 1


def _around_varint_lengths(rng: random.Random) -> int:
    """An id or timestamp at, just below or just above a varint length boundary."""
    shift = rng.choice(range(7, 63, 7))
    return max(0, min(I63, (1 << shift) + rng.randrange(-3, 3)))


def _random_run(rng: random.Random) -> tuple[int, int, int, list[bytes]]:
    stream_id = rng.choice([0, 1, 7, (1 << 64) - 1, rng.getrandbits(64)])
    count = rng.choice([0, 1, 2, 5, 40, 300])
    first = rng.choice(
        [0, 1, 126, rng.getrandbits(20), rng.getrandbits(62), I63 - max(count, 1) + 1]
        + [_around_varint_lengths(rng) - rng.randrange(count + 1)] * 4
    )
    first = max(0, min(first, I63 - max(count, 1) + 1))
    stamp = rng.choice([0, 1, 127, 128, 1_700_000_000_000, I63, _around_varint_lengths(rng)])
    sizes = [0, 1, 5, 127, 128, 1024, 16383, 16384, 70_000]
    payloads = [rng.randbytes(rng.choice(sizes)) for _ in range(count)]
    return stream_id, first, stamp, payloads


@pytest.mark.skipif(not native.BUILT, reason="the compiled module is not built")
@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_run_is_the_python_definition(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        stream_id, first, stamp, payloads = _random_run(rng)
        expected = prepare_entries_python(stream_id, first, stamp, payloads)
        got = native.prepare_entries(stream_id, first, stamp, payloads, PreparedEntry)
        assert got == expected, (stream_id, first, stamp, [len(p) for p in payloads])
        assert all(type(entry) is PreparedEntry for entry in got)
        assert prepare_entries(stream_id, first, stamp, payloads) == expected


@pytest.mark.skipif(not native.BUILT, reason="the compiled module is not built")
def test_every_id_across_the_varint_boundaries() -> None:
    payloads = [bytes(range(n % 256)) * (n % 5) for n in range(300)]
    for shift in range(7, 63, 7):
        first = max(0, (1 << shift) - 150)
        expected = prepare_entries_python(9, first, (1 << shift) - 1, payloads)
        assert native.prepare_entries(9, first, (1 << shift) - 1, payloads, PreparedEntry) == (
            expected
        )
    # The framed entries parse back as protobuf does.
    run = native.prepare_entries(9, 120, 5, payloads[:20], PreparedEntry)
    request = pb.AddRequest.FromString(b"".join(e.framed for e in run))
    assert [e.entry_id for e in request.entries] == list(range(120, 140))
    assert [e.payload for e in request.entries] == payloads[:20]


@pytest.mark.skipif(not native.BUILT, reason="the compiled module is not built")
def test_bytes_like_payloads_are_prepared_as_their_bytes() -> None:
    views = [bytearray(b"de"), memoryview(b"xfgh")[1:]]
    data: list[bytes] = [b"abc", *views, b""]  # type: ignore[list-item]
    expected = prepare_entries_python(3, 0, 7, [bytes(p) for p in data])
    assert native.prepare_entries(3, 0, 7, data, PreparedEntry) == expected


@pytest.mark.skipif(not native.BUILT, reason="the compiled module is not built")
def test_the_compiled_run_refuses_what_the_wire_cannot_carry() -> None:
    good = [b"x"]
    for stream_id, first, stamp, payloads in [
        (-1, 0, 0, good),
        (1 << 64, 0, 0, good),
        (1, -1, 0, good),
        (1, 0, -1, good),
        (1, I63, 0, [b"x", b"y"]),  # the second id would pass 2**63 - 1
        (1, 1 << 63, 0, good),
    ]:
        with pytest.raises(OverflowError):
            native.prepare_entries(stream_id, first, stamp, payloads, PreparedEntry)
    with pytest.raises(TypeError):
        native.prepare_entries(1, 0, 0, (b"x",), PreparedEntry)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        native.prepare_entries(1, 0, 0, good, list)  # type: ignore[type-var]
    with pytest.raises(TypeError):
        native.prepare_entries(1, 0, 0, ["not bytes"], PreparedEntry)  # type: ignore[list-item]
    assert native.prepare_entries(1, I63, 0, good, PreparedEntry)[0].entry_id == I63


def test_without_the_compiled_module_the_writer_prepares_in_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(5)
    runs = [_random_run(rng) for _ in range(30)]
    expected = [prepare_entries_python(*run) for run in runs]
    monkeypatch.setattr(prepare, "use_native", False)

    def unbuilt(*args: object) -> None:
        raise AssertionError("the compiled module was called")

    monkeypatch.setattr(native, "prepare_entries", unbuilt, raising=False)
    assert [prepare_entries(*run) for run in runs] == expected
