"""The hand-made entry encoding is byte-for-byte protobuf's, and framed batches parse back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stream.client.entries import checksum_ok, prepare_entries, prepare_entry, varint
from stream.client.ports import AddBatch
from stream.protocol import EntryFlag, entry_checksum
from stream.wire import bookie_pb2 as pb

ids = st.integers(min_value=0, max_value=(1 << 63) - 1)
stamps = st.integers(min_value=0, max_value=(1 << 63) - 1)
flags = st.sampled_from([0, int(EntryFlag.NOOP), int(EntryFlag.NOOP | EntryFlag.TRUNCATE)])


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_varint_matches_protobuf(value: int) -> None:
    encoded = pb.Entry(crc32c=value & 0xFFFFFFFF).SerializeToString()
    if value & 0xFFFFFFFF:
        assert encoded == b"\x28" + varint(value & 0xFFFFFFFF)
    assert pb.ReadLacRequest.FromString(b"\x10" + varint(value)).known_lac == (
        value if value < 1 << 63 else value - (1 << 64)
    )


def test_varint_matches_protobuf_at_every_length_boundary() -> None:
    for shift in range(7, 64, 7):
        for value in (2**shift - 1, 2**shift, 2**shift + 1):
            if value >= 1 << 63:
                continue  # known_lac is an int64
            expected = pb.ReadLacRequest(known_lac=value).SerializeToString()
            assert b"\x10" + varint(value) == expected, value


@given(
    st.integers(min_value=1, max_value=(1 << 63) - 1),
    ids,
    flags,
    stamps,
    st.binary(max_size=3000),
)
def test_prepared_entry_is_the_protobuf_encoding(
    stream_id: int, entry_id: int, flag: int, stamp: int, payload: bytes
) -> None:
    prepared = prepare_entry(stream_id, entry_id, flag, stamp, payload)
    expected = pb.Entry(
        entry_id=entry_id,
        flags=flag,
        timestamp_ms=stamp,
        payload=payload,
        crc32c=entry_checksum(stream_id, entry_id, flag, stamp, payload),
    )
    decoded = prepared.entry()
    assert decoded == expected
    assert checksum_ok(stream_id, decoded)
    assert prepared.payload_bytes == len(payload)
    assert prepared.entry_id == entry_id
    assert prepare_entry(stream_id, entry_id, flag, stamp, payload, varint(stamp)).framed == (
        prepared.framed
    )


def test_batches_of_prepared_entries_parse_as_add_requests() -> None:
    entries = [prepare_entry(7, i, 0, 1_700_000_000_000, b"p%d" % i) for i in range(5)]
    batch = AddBatch(stream_id=7, term=3, lac=1, lafr=0, recovery=True, entries=entries)
    request = pb.AddRequest.FromString(batch.to_bytes())
    assert (request.stream_id, request.term, request.lac, request.lafr) == (7, 3, 1, 0)
    assert request.recovery
    assert [e.payload for e in request.entries] == [b"p%d" % i for i in range(5)]
    assert batch.to_request() == request
    explicit_lac = AddBatch(stream_id=7, term=3, lac=4, lafr=4).to_request()
    assert list(explicit_lac.entries) == [] and explicit_lac.lac == 4


def test_a_corrupted_entry_fails_its_checksum() -> None:
    entry = prepare_entry(9, 1, 0, 5, b"payload").entry()
    entry.payload = b"payloaD"
    assert not checksum_ok(9, entry)
    assert not checksum_ok(10, prepare_entry(9, 1, 0, 5, b"payload").entry())


@given(
    st.integers(min_value=1, max_value=(1 << 63) - 1),
    st.integers(min_value=0, max_value=(1 << 63) - 300),
    stamps,
    st.lists(st.binary(max_size=300), max_size=300),
)
def test_prepared_run_is_prepare_entry_of_each(
    stream_id: int, first_entry_id: int, stamp: int, payloads: list[bytes]
) -> None:
    run = prepare_entries(stream_id, first_entry_id, stamp, payloads)
    assert run == [
        prepare_entry(stream_id, first_entry_id + i, 0, stamp, payload)
        for i, payload in enumerate(payloads)
    ]


def test_prepared_run_across_varint_boundaries() -> None:
    payloads = [bytes(range(n % 256)) * (n % 5) for n in range(400)]
    for first in (0, 100, 16_000, 2**21 - 200, 2**35 - 7, 2**62):
        run = prepare_entries(7, first, 1_700_000_000_000, payloads)
        assert run == [
            prepare_entry(7, first + i, 0, 1_700_000_000_000, p) for i, p in enumerate(payloads)
        ]


def test_verified_run_checks_and_converts_like_the_entry_by_entry_path() -> None:
    from stream.client.entries import Entry, checksum_ok, is_noop, verified_run

    def wire(entry_id: int, flags: int = 0, payload: bytes = b"p", bad: bool = False) -> pb.Entry:
        prepared = prepare_entry(9, entry_id, flags, 1_700_000_000_000 + entry_id, payload)
        entry = prepared.entry()
        if bad:
            entry.crc32c ^= 1
        return entry

    runs = [
        [wire(5), wire(6, flags=1), wire(7, payload=b"x" * 300)],  # all good, one no-op
        [wire(5), wire(6, bad=True), wire(7)],  # stops at the bad checksum
        [wire(5), wire(7)],  # stops at the gap
        [wire(4)],  # not the id asked for
        [],
    ]
    for entries in runs:
        count, good = verified_run("s", 9, 5, entries)
        expected = 0
        for entry in entries:
            if entry.entry_id != 5 + expected or not checksum_ok(9, entry):
                break
            expected += 1
        assert count == expected
        assert good == [
            Entry("s", e.entry_id, e.payload, e.timestamp_ms)
            for e in entries[:expected]
            if not is_noop(e)
        ]
