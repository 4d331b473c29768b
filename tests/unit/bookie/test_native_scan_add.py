"""The compiled scan of Add requests (`scan_add` in stream/framing/_native.c) is held to the
Python definition, what the bookie does without it: protobuf's parse, `_scan_entries` and each
entry's `SerializeToString`. On seeded random AddRequests (any header values, entries with
flags, attributes, bad checksums, negative ids and oversized payloads; written by protobuf, or
by hand with fields reordered, repeated, default-valued, padded, over 32 bits or unknown;
truncated and corrupted; random bytes), wherever the scan gives something it gives exactly
what the definition gives; it gives something for every request protobuf writes and every
request the client frames by hand, and None wherever protobuf cannot parse (the bookie then
parses, and answers, as before). Requests are placed against an unreadable page, so a read
past a request's end crashes the test instead of passing unseen.

Then the storage serves a scanned batch exactly as the parsed one: same answers, same
entries held, same journal."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import DecodeError

from stream.bookie import access
from stream.bookie.storage import StreamStorage
from stream.bookie.storage import scanned as scanned_module
from stream.bookie.storage.adds import _scan_entries
from stream.bookie.storage.scanned import ScannedAdd, entry_ids, parse_add
from stream.client.ports import AddBatch
from stream.framing import native
from stream.framing.encoding import varint
from stream.framing.prepare import AttributedPayload, prepare_entry, prepare_mixed_entries
from stream.protocol import EntryFlag, entry_checksum
from stream.protocol.checksum import encode_attributes
from stream.wire import bookie_pb2 as pb
from tests.unit.client.test_native_walk import _PAGE_END, _corrupt

from .storage_support import crash_and_reopen, flush, make_config, open_storage, wait

NOOP = int(EntryFlag.NOOP)
TRUNCATE = int(EntryFlag.TRUNCATE)
ATTRIBUTES = int(EntryFlag.ATTRIBUTES)
U64 = (1 << 64) - 1
I64 = 1 << 63


def _expected(raw: bytes, max_entry_bytes: int) -> tuple[Any, bool]:
    """Returns (what the Python definition gives for `raw`, None when protobuf cannot parse
    it; whether `raw` is exactly what protobuf writes, with neither unknown fields nor
    headers: such a request must be scanned)."""
    try:
        request = pb.AddRequest.FromString(raw)
    except DecodeError:
        return None, False
    entries = list(request.entries)
    ids, total, special = _scan_entries(request.stream_id, entries, max_entry_bytes)
    header = (request.stream_id, request.term, request.lac, request.lafr, request.recovery)
    datas = [e.SerializeToString() for e in entries]
    known = pb.AddRequest.FromString(raw)
    known.DiscardUnknownFields()
    written = known.SerializeToString() == raw and not any(e.headers for e in entries)
    return (*header, request.request_id, ids, total, special, datas), written


def _check(raw: bytes, max_entry_bytes: int) -> str:
    """Checks the scan of `raw` against the definition; returns "scanned", "left" (to
    protobuf) or "refused" (by protobuf)."""
    expected, written = _expected(raw, max_entry_bytes)
    request = _PAGE_END.place(raw) if len(raw) <= _PAGE_END.page else raw
    got = native.scan_add(request, max_entry_bytes)
    if expected is None:
        assert got is None, raw
        return "refused"
    if got is None:
        assert not written, raw
        return "left"
    assert got == expected, raw
    return "scanned"


# ------------------------------------------------------------------ random requests


def _field(number: int, wire_type: int, body: bytes) -> bytes:
    return varint(number << 3 | wire_type) + body


def _v(value: int) -> bytes:
    return varint(value & U64)


def _len(data: bytes) -> bytes:
    return varint(len(data)) + data


def _oddity(rng: random.Random, fields: list[bytes], numbers: list[int]) -> str:
    """Changes `fields` (one message's, in protobuf's order and form) into a form protobuf
    does not write but may parse; returns what it did."""
    how = rng.choice(
        ["swap", "repeat", "default", "pad", "high", "unknown", "group", "bool", "over"]
    )
    at = rng.randrange(len(fields) + 1)
    if how == "swap" and len(fields) >= 2:
        i = rng.randrange(len(fields) - 1)
        fields[i], fields[i + 1] = fields[i + 1], fields[i]
    elif how == "repeat" and fields:
        i = rng.randrange(len(fields))
        fields.insert(i, fields[i])
    elif how == "default":
        number = rng.choice(numbers)
        fields.insert(
            at, _field(number, 2, b"\x00") if number in (4, 7) else _field(number, 0, b"\x00")
        )
    elif how == "pad" and fields:
        # The same value with a redundant varint group (a 10-byte one becomes 11: malformed).
        i = rng.randrange(len(fields))
        tag, rest = fields[i][:1], fields[i][1:]
        end = next(j for j, b in enumerate(rest) if not b & 0x80)
        fields[i] = tag + rest[:end] + bytes([rest[end] | 0x80, 0]) + rest[end + 1 :]
    elif how == "high":  # bits past 32 in a uint32 field, past 64 in any
        fields.insert(at, _field(rng.choice([2, 5]), 0, varint(rng.getrandbits(40) | 1 << 33)))
    elif how == "unknown":
        fields.insert(
            at,
            rng.choice(
                [
                    _field(9, 0, b"\x01"),
                    _field(20, 2, b"\x01x"),
                    _field(15, 5, b"1234"),
                    b"\x4d1234",
                ]
            ),
        )
    elif how == "group":
        fields.insert(at, _field(10, 3, b"") + _field(10, 4, b""))
    elif how == "bool":
        fields.insert(at, _field(5, 0, b"\x02"))
    else:  # a 10-byte varint whose last byte carries more than bit 63
        fields.insert(at, _field(rng.choice(numbers), 0, b"\xff" * 9 + b"\x7f"))
    return how


def _entry(rng: random.Random, stream_id: int, max_entry_bytes: int) -> pb.Entry:
    """A random entry, its checksum mostly right."""
    entry_id = rng.choice([0, 1, 127, 128, rng.getrandbits(20), rng.getrandbits(63), -1, -I64])
    flags = rng.choice([0] * 8 + [NOOP, TRUNCATE, NOOP | TRUNCATE, ATTRIBUTES, rng.getrandbits(32)])
    stamp = rng.choice([0, 1, 1_700_000_000_000, -5, rng.getrandbits(63), -I64])
    size = rng.choice([0, 0, 1, 17, 300, max_entry_bytes, max_entry_bytes + 1])
    payload = rng.randbytes(size)
    key = rng.choice([None] * 8 + [b"", b"key"])
    headers = [("h", b"v")] if rng.random() < 0.05 else []
    sequence = rng.choice([0] * 8 + [1, 2**40, -3])
    attributes = b""
    if flags & ATTRIBUTES:
        attributes = encode_attributes(key, headers, sequence)
    crc = entry_checksum(stream_id, entry_id, flags & 0xFFFFFFFF, stamp, payload, attributes)
    if rng.random() < 0.1:
        crc ^= 1 << rng.randrange(32)
    entry = pb.Entry(
        entry_id=entry_id,
        flags=flags,
        timestamp_ms=stamp,
        payload=payload,
        crc32c=crc,
        key=key,
        headers=[pb.Header(name=n, value=v) for n, v in headers],
        sequence=sequence,
    )
    return entry


def _entry_fields(entry: pb.Entry) -> list[bytes]:
    """The entry's fields as protobuf writes them (each checked against protobuf)."""
    fields = []
    if entry.entry_id:
        fields.append(_field(1, 0, _v(entry.entry_id)))
    if entry.flags:
        fields.append(_field(2, 0, _v(entry.flags)))
    if entry.timestamp_ms:
        fields.append(_field(3, 0, _v(entry.timestamp_ms)))
    if entry.payload:
        fields.append(_field(4, 2, _len(entry.payload)))
    if entry.crc32c:
        fields.append(_field(5, 0, _v(entry.crc32c)))
    if entry.HasField("key"):
        fields.append(_field(6, 2, _len(entry.key)))
    fields += [_field(7, 2, _len(h.SerializeToString())) for h in entry.headers]
    if entry.sequence:
        fields.append(_field(8, 0, _v(entry.sequence)))
    assert b"".join(fields) == entry.SerializeToString()
    return fields


def _random_request(rng: random.Random, max_entry_bytes: int) -> tuple[bytes, str]:
    """A random AddRequest's bytes and what was odd about them ("" for nothing)."""
    stream_id = rng.choice([0, 1, 7, rng.getrandbits(64), U64])
    header = pb.AddRequest(
        stream_id=stream_id,
        term=rng.choice([0, 1, 2, rng.getrandbits(64)]),
        lac=rng.choice([-1, 0, 5, rng.getrandbits(63), -I64]),
        lafr=rng.choice([-1, 0, 3, -2]),
        recovery=rng.random() < 0.2,
        request_id=rng.choice([0, 1, rng.getrandbits(64)]),
    )
    fields = []
    for number, value in enumerate(
        [header.stream_id, header.term, header.lac, header.lafr, int(header.recovery)], start=1
    ):
        if value:
            fields.append(_field(number, 0, _v(value)))
    if header.request_id:
        fields.append(_field(6, 0, _v(header.request_id)))
    odd = ""
    entries = []
    written = []  # as protobuf writes them
    for _ in range(rng.choice([0, 1, 2, 5, 20])):
        entry = _entry(rng, stream_id, max_entry_bytes)
        header.entries.append(entry)
        body = _entry_fields(entry)
        written.append(_field(7, 2, _len(b"".join(body))))
        if rng.random() < 0.03:
            odd = "entry " + _oddity(rng, body, [1, 2, 3, 4, 5, 6, 8])
        entries.append(_field(7, 2, _len(b"".join(body))))
    assert b"".join(fields + written) == header.SerializeToString()
    if rng.random() < 0.1:
        odd = "header " + _oddity(rng, fields, [1, 2, 3, 4, 5, 6])
    if entries and rng.random() < 0.03:  # a header field after the entries
        entries.insert(rng.randrange(len(entries)), fields.pop(0) if fields else b"\x08\x01")
        odd = "late header"
    raw = b"".join(fields + entries)
    if raw and rng.random() < 0.1:
        raw = _corrupt(rng, raw)
        odd = "corrupt"
    return raw, odd


@pytest.mark.parametrize("seed", range(8))
def test_the_scan_gives_what_the_python_definition_gives(seed: int) -> None:
    """Where the scan gives something, it is what the definition gives; it gives something
    for every request protobuf writes; it gives None where protobuf cannot parse."""
    rng = random.Random(seed)
    seen: Counter[str] = Counter()
    odd: Counter[str] = Counter()
    for _ in range(400):
        max_entry_bytes = rng.choice([64, 300, 4096])
        raw, oddity = _random_request(rng, max_entry_bytes)
        outcome = _check(raw, max_entry_bytes)
        seen[outcome] += 1
        if oddity and outcome != "refused":
            odd[outcome] += 1
    # The requests exercise all three, odd ones both scanned (defaults written out, an empty
    # key added) and left to protobuf.
    assert seen["scanned"] > 150 and seen["left"] > 20 and seen["refused"] > 5, seen
    assert odd["scanned"] and odd["left"] > 10, odd


def test_random_bytes_never_crash_the_scan() -> None:
    rng = random.Random(11)
    for _ in range(3000):
        data = rng.randbytes(rng.randrange(0, 64))
        if rng.random() < 0.5:  # mostly entries, so the scan goes into one
            data = b"\x08\x01\x3a" + bytes([len(data)]) + data
        _check(data, 100)


@pytest.mark.parametrize("seed", range(3))
def test_what_writers_send_is_scanned(seed: int) -> None:
    """The client frames entries by hand (stream/framing/prepare.py), writing some default
    values out (entry 0, a no-op's empty payload, a zero timestamp): scanned, each entry's
    bytes as protobuf writes them."""
    rng = random.Random(seed)
    for _ in range(50):
        stream_id = rng.choice([1, rng.getrandbits(64)])
        first = rng.choice([0, 1, 127, rng.getrandbits(40)])
        stamp = rng.choice([0, 1_700_000_000_000])
        payloads: list[bytes | AttributedPayload] = [
            rng.randbytes(rng.choice([0, 1, 100])) for _ in range(rng.randrange(1, 6))
        ]
        if rng.random() < 0.3:
            payloads.append(AttributedPayload(b"v", rng.choice([None, b"", b"k"]), (), 7))
        prepared = prepare_mixed_entries(stream_id, first, stamp, payloads)
        prepared.append(prepare_entry(stream_id, first + len(prepared), NOOP, stamp, b""))
        batch = AddBatch(
            stream_id=stream_id,
            term=rng.choice([1, 9]),
            lac=first - 1,
            lafr=rng.choice([-1, 0]),
            recovery=rng.random() < 0.2,
            entries=prepared,
            request_id=rng.choice([0, 5]),
        )
        assert _check(batch.to_bytes(), 1 << 20) == "scanned"


def test_the_scan_refuses_what_is_not_an_add_request() -> None:
    with pytest.raises(TypeError):
        native.scan_add("text", 10)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        native.scan_add(b"")  # type: ignore[call-arg]
    with pytest.raises(OverflowError):
        native.scan_add(b"", 1 << 64)
    assert native.scan_add(b"", 10) == (0, 0, 0, 0, False, 0, [], 0, [], [])


def test_parse_add_scans_what_it_can_and_parses_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = pb.Entry(entry_id=3, timestamp_ms=9, payload=b"abc")
    entry.crc32c = entry_checksum(5, 3, 0, 9, b"abc")
    request = pb.AddRequest(stream_id=5, term=2, lac=1, lafr=-1, request_id=8, entries=[entry])
    raw = request.SerializeToString()
    batch = parse_add(raw, 100)
    assert isinstance(batch, ScannedAdd)
    assert (batch.stream_id, batch.term, batch.lac, batch.lafr, batch.request_id) == (
        5,
        2,
        1,
        -1,
        8,
    )
    assert batch.entries == [entry] and entry_ids(batch) == [3] and batch.raw is raw
    # Another form, or no compiled scan: protobuf parses (and refuses what it cannot).
    assert parse_add(raw + b"\x08\x05", 100) == pb.AddRequest.FromString(raw + b"\x08\x05")
    with pytest.raises(DecodeError):
        parse_add(raw[:-1], 100)
    monkeypatch.setattr(scanned_module, "_scan", None)
    assert parse_add(raw, 100) == request


# ------------------------------------------------------------------ served the same


def _batches(rng: random.Random, stream_id: int) -> list[bytes]:
    """Batches of a stream that exercise every rule of the add path: bad checksums, negative
    ids, oversized payloads, truncations, attributes, ids below a trim point and at or below
    the LAC, repeated and forged overwrites, empty batches, terms up and down."""
    out: list[bytes] = []
    next_id = 0
    term = 1
    for _ in range(60):
        term = max(1, term + rng.choice([0, 0, 0, 0, 1, -1]))
        count = rng.choice([0, 1, 3, 8])
        entries = []
        for k in range(count):
            entry_id = rng.choice([next_id + k] * 6 + [max(0, next_id - 5 + k), -1])
            flags = rng.choice([0] * 10 + [NOOP, NOOP | TRUNCATE, ATTRIBUTES])
            payload = rng.randbytes(rng.choice([0, 10, 100, 2000]))
            sequence = rng.randrange(1, 100) if flags & ATTRIBUTES else 0
            attributes = encode_attributes(None, (), sequence) if sequence else b""
            crc = entry_checksum(stream_id, entry_id, flags, 5, payload, attributes)
            if rng.random() < 0.05:
                crc ^= 1
            entries.append(
                pb.Entry(
                    entry_id=entry_id,
                    flags=flags,
                    timestamp_ms=5,
                    payload=payload,
                    crc32c=crc,
                    sequence=sequence,
                )
            )
        next_id += rng.choice([0, count, count])
        lac = next_id - rng.choice([1, 3, 10])
        request = pb.AddRequest(
            stream_id=stream_id,
            term=term,
            lac=max(-1, lac),
            lafr=max(-1, lac - 2),
            recovery=rng.random() < 0.1,
            request_id=len(out) + 1,
            entries=entries,
        )
        out.append(request.SerializeToString())
    return out


def _held(storage: StreamStorage, stream_id: int) -> tuple[Any, ...]:
    state = storage.stream_state(stream_id)
    if state is None:
        return ()
    reads = [storage.read(stream_id, i) for i in range(-1, state.last_entry_id + 2)]
    return (
        state,
        [(r.code, r.entry.SerializeToString() if r.entry else b"") for r in reads],
        storage.lac(stream_id),
    )


@pytest.mark.parametrize("seed", range(3))
def test_the_storage_serves_a_scanned_batch_as_the_parsed_one(tmp_path: Path, seed: int) -> None:
    """Two bookies take the same batches, one parsed by protobuf, the other through
    `parse_add`; with trims and flushes between. Their answers and what they hold (before and
    after a crash, from the journal) are the same."""
    rng = random.Random(seed)
    stream_id = 1 << 40 | seed
    configs = [make_config(tmp_path / name, max_entry_bytes=1000) for name in ("parsed", "scanned")]
    storages = [open_storage(config)[0] for config in configs]
    took_scanned = took_special = 0
    try:
        for n, raw in enumerate(_batches(rng, stream_id)):
            if n % 17 == 16:
                for storage in storages:
                    wait(storage.trim(stream_id, n).durable)
            if n % 11 == 10:
                for storage in storages:
                    flush(storage)
            batch = parse_add(raw, 1000)
            if isinstance(batch, ScannedAdd):
                took_scanned += 1
                took_special += bool(batch.special)
            outcomes = [
                storages[0].add_batch(pb.AddRequest.FromString(raw), raw),
                storages[1].add_batch(batch, raw),
            ]
            for outcome in outcomes:
                wait(outcome.durable)
            first, second = ((o.codes, o.bookie_term, o.message, o.entry_ids) for o in outcomes)
            assert first == second, n
            assert _held(storages[0], stream_id) == _held(storages[1], stream_id), n
        storages = [
            crash_and_reopen(storage, config)[0]
            for storage, config in zip(storages, configs, strict=True)
        ]
        assert _held(storages[0], stream_id) == _held(storages[1], stream_id)
    finally:
        for storage in storages:
            storage.close()
    assert took_scanned > 40 and took_special > 5, (took_scanned, took_special)


def test_a_recovery_add_is_audited_alike_scanned_or_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    audited: list[dict[str, Any]] = []
    monkeypatch.setattr(access, "audit", lambda action, caller, **fields: audited.append(fields))
    entries = [pb.Entry(entry_id=i, timestamp_ms=1, payload=b"p", crc32c=1) for i in (4, 5)]
    for request in [
        pb.AddRequest(stream_id=3, term=2, recovery=True, entries=entries),
        pb.AddRequest(stream_id=3, term=2, recovery=True),
    ]:
        raw = request.SerializeToString()
        batch = parse_add(raw, 100)
        assert isinstance(batch, ScannedAdd)
        access.audit_recovery_add(batch)
        access.audit_recovery_add(request)
    assert audited == [
        *[{"stream_id": 3, "term": 2, "first_entry_id": 4, "entries": 2}] * 2,
        *[{"stream_id": 3, "term": 2, "first_entry_id": None, "entries": 0}] * 2,
    ]
