"""The hand-made entry encoding is byte-for-byte protobuf's, framed batches parse back, and
the range readers' checks of what a bookie returned agree with the entry-by-entry rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stream.client.entry import Entry, EntryColumns, verified_columns
from stream.client.ports import AddBatch
from stream.framing.encoding import varint
from stream.framing.prepare import (
    AttributedPayload,
    prepare_entries,
    prepare_entry,
    prepare_mixed_entries,
    prepare_sequenced_entries,
)
from stream.framing.verify import checksum_ok, good_run, is_noop, wire_attributes
from stream.protocol import EntryFlag, entry_checksum
from stream.protocol.checksum import encode_attributes
from stream.wire import bookie_pb2 as pb

ids = st.integers(min_value=0, max_value=(1 << 63) - 1)
stamps = st.integers(min_value=0, max_value=(1 << 63) - 1)
flags = st.sampled_from([0, int(EntryFlag.NOOP), int(EntryFlag.NOOP | EntryFlag.TRUNCATE)])
keys = st.none() | st.binary(max_size=20)
headers = st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=20)), max_size=3).map(tuple)
sequences = st.sampled_from([0, 0, 1, 2**40, -1])


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


def _reference_run(
    stream_id: int, first_entry_id: int, entries: list[pb.Entry]
) -> tuple[int, list[pb.Entry]]:
    """The rule entry by entry, through `checksum_ok` and `is_noop`: how many of `entries` are
    ids first, first+1... with a good checksum (up to the first that is not), and those of
    them that are not no-ops."""
    count = 0
    for entry in entries:
        if entry.entry_id != first_entry_id + count or not checksum_ok(stream_id, entry):
            break
        count += 1
    return count, [e for e in entries[:count] if not is_noop(e)]


def _wire(
    stream_id: int, entry_id: int, flags: int = 0, payload: bytes = b"p", bad: bool = False
) -> pb.Entry:
    entry = prepare_entry(stream_id, entry_id, flags, 1_700_000_000_000 + entry_id, payload)
    decoded = entry.entry()
    if bad:
        decoded.crc32c ^= 1
    return decoded


def test_verified_columns_checks_and_converts_like_the_entry_by_entry_path() -> None:
    runs = [
        [_wire(9, 5), _wire(9, 6, flags=1), _wire(9, 7, payload=b"x" * 300)],  # one no-op
        [_wire(9, 5), _wire(9, 6, bad=True), _wire(9, 7)],  # stops at the bad checksum
        [_wire(9, 5), _wire(9, 7)],  # stops at the gap
        [_wire(9, 4)],  # not the id asked for
        [_wire(10, 5)],  # another stream's checksum
        [],
    ]
    for entries in runs:
        columns = EntryColumns.empty()
        count = verified_columns(9, 5, entries, *columns)
        expected, kept = _reference_run(9, 5, entries)
        assert count == expected == good_run(9, 5, entries)
        assert columns == EntryColumns(
            [e.entry_id for e in kept],
            [e.payload for e in kept],
            [e.timestamp_ms for e in kept],
            {},
        )
        assert columns.to_entries("s") == [
            Entry("s", e.entry_id, e.payload, e.timestamp_ms) for e in kept
        ]


_FAULTS = ["none"] * 30 + ["gap", "repeat", "crc", "payload", "stream", "stamp", "flags"]
_FAULTS += ["key", "header"]  # for entries with attributes


@st.composite
def _wire_runs(draw: st.DrawFn) -> tuple[int, int, list[pb.Entry]]:
    """A stream id, the first id asked for, and a run of entries as a bookie might answer:
    mostly good, with no-ops, gaps, repeats and corrupted checksums anywhere."""
    stream_id = draw(st.integers(min_value=0, max_value=(1 << 64) - 1))
    first = draw(st.integers(min_value=0, max_value=(1 << 63) - 100))
    entries = []
    entry_id = first + draw(st.sampled_from([0] * 6 + [1, -1]))
    for _ in range(draw(st.integers(min_value=0, max_value=30))):
        fault = draw(st.sampled_from(_FAULTS))
        if fault == "gap":
            entry_id += 1
        elif fault == "repeat":
            entry_id -= 1
        entry_id = max(entry_id, 0)
        payload = draw(st.binary(max_size=64))
        entry_flags = draw(flags)
        if entry_flags:
            entry = prepare_entry(stream_id, entry_id, entry_flags, draw(stamps), payload).entry()
        else:  # an entry with attributes now and then: they take the slow path
            entry = prepare_entry(
                stream_id,
                entry_id,
                0,
                draw(stamps),
                payload,
                key=draw(keys),
                headers=draw(headers),
                sequence=draw(sequences),
            ).entry()
        if fault == "crc":
            entry.crc32c ^= 1 << draw(st.integers(min_value=0, max_value=31))
        elif fault == "payload":
            entry.payload = payload + b"!"
        elif fault == "stream":
            entry.crc32c = entry_checksum(
                stream_id ^ 1, entry_id, entry.flags, entry.timestamp_ms, entry.payload
            )
        elif fault == "stamp":
            entry.timestamp_ms ^= 1
        elif fault == "flags":
            entry.flags ^= int(EntryFlag.NOOP)
        elif fault == "key" and entry.flags:
            entry.key = (entry.key if entry.HasField("key") else b"") + b"!"
        elif fault == "header" and entry.flags:
            entry.headers.add(name="extra", value=b"")
        entries.append(entry)
        entry_id += 1
    return stream_id, first, entries


@given(_wire_runs(), st.integers(min_value=0, max_value=3))
def test_verified_columns_agrees_with_the_entry_by_entry_rule(
    run: tuple[int, int, list[pb.Entry]], already: int
) -> None:
    stream_id, first, entries = run
    expected, kept = _reference_run(stream_id, first, entries)
    # Appends to what the caller's lists hold; takes a message's repeated field as well.
    before = EntryColumns(list(range(already)), [b"old"] * already, [0] * already, {})
    columns = EntryColumns(list(before.ids), list(before.payloads), list(before.timestamps_ms), {})
    response = pb.ReadRangeResponse(entries=entries)
    assert verified_columns(stream_id, first, response.entries, *columns) == expected
    # The range readers that keep the messages (recovery, re-replication, scrub) agree.
    assert good_run(stream_id, first, response.entries) == expected
    assert columns == EntryColumns(
        before.ids + [e.entry_id for e in kept],
        before.payloads + [e.payload for e in kept],
        before.timestamps_ms + [e.timestamp_ms for e in kept],
        {
            already + position: wire_attributes(e)
            for position, e in enumerate(kept)
            if e.flags & EntryFlag.ATTRIBUTES
        },
    )
    again = EntryColumns.empty()
    assert verified_columns(stream_id, first, entries, *again) == expected
    assert again.to_entries("s") == [_app_entry(e) for e in kept]


def _app_entry(entry: pb.Entry) -> Entry:
    key, headers = wire_attributes(entry) if entry.flags & EntryFlag.ATTRIBUTES else (None, ())
    return Entry("s", entry.entry_id, entry.payload, entry.timestamp_ms, key, headers)


def test_columns_extend_and_convert_to_entries() -> None:
    columns = EntryColumns([1], [b"a"], [10], {0: (b"k", ())})
    columns.extend(EntryColumns([2, 3], [b"b", b"c"], [20, 30], {1: (None, (("h", b"v"),))}))
    assert columns == EntryColumns(
        [1, 2, 3], [b"a", b"b", b"c"], [10, 20, 30], {0: (b"k", ()), 2: (None, (("h", b"v"),))}
    )
    assert columns.key_column() == [b"k", None, None]
    assert columns.headers_column() == [(), (), (("h", b"v"),)]
    assert columns.to_entries("s") == [
        Entry("s", 1, b"a", 10, key=b"k"),
        Entry("s", 2, b"b", 20),
        Entry("s", 3, b"c", 30, headers=(("h", b"v"),)),
    ]
    assert EntryColumns.empty().to_entries("s") == []


@given(
    st.integers(min_value=1, max_value=(1 << 63) - 1),
    st.integers(min_value=0, max_value=(1 << 63) - 1),
    stamps,
    st.binary(max_size=300),
    st.integers(min_value=1, max_value=(1 << 63) - 1),
)
def test_sequence_only_entry_is_the_protobuf_encoding(
    stream_id: int, entry_id: int, stamp: int, payload: bytes, sequence: int
) -> None:
    """An idempotent producer's entries (a sequence, no key or headers) are hand-encoded: they
    parse as the protobuf message, with the attributes' checksum."""
    prepared = prepare_entry(stream_id, entry_id, 0, stamp, payload, sequence=sequence)
    flags = int(EntryFlag.ATTRIBUTES)
    expected = pb.Entry(
        entry_id=entry_id,
        flags=flags,
        timestamp_ms=stamp,
        payload=payload,
        crc32c=entry_checksum(
            stream_id, entry_id, flags, stamp, payload, encode_attributes(None, (), sequence)
        ),
        sequence=sequence,
    )
    assert prepared.entry() == expected
    assert checksum_ok(stream_id, prepared.entry())


@given(
    st.integers(min_value=1, max_value=(1 << 63) - 1),
    st.integers(min_value=0, max_value=(1 << 63) - 300),
    stamps,
    st.lists(
        st.tuples(
            st.binary(max_size=200),
            st.integers(min_value=1, max_value=(1 << 63) - 1),
            st.sampled_from([None, b"", b"k"]),
        ),
        max_size=50,
    ),
)
def test_prepared_producer_run_is_prepare_entry_of_each(
    stream_id: int, first_entry_id: int, stamp: int, rows: list[tuple[bytes, int, bytes | None]]
) -> None:
    payloads = [AttributedPayload(p, key, (), sequence) for p, sequence, key in rows]
    run = prepare_sequenced_entries(stream_id, first_entry_id, stamp, payloads)
    assert run == [
        prepare_entry(stream_id, first_entry_id + i, 0, stamp, p, key=key, sequence=sequence)
        for i, (p, sequence, key) in enumerate(rows)
    ]


@given(
    st.integers(min_value=1, max_value=(1 << 63) - 1),
    st.integers(min_value=0, max_value=(1 << 63) - 300),
    stamps,
    st.lists(
        st.binary(max_size=50)
        | st.builds(AttributedPayload, st.binary(max_size=50), keys, headers),
        max_size=30,
    ),
)
def test_prepared_mixed_run_is_prepare_entry_of_each(
    stream_id: int,
    first_entry_id: int,
    stamp: int,
    payloads: list[bytes | AttributedPayload],
) -> None:
    run = prepare_mixed_entries(stream_id, first_entry_id, stamp, payloads)
    assert run == [
        prepare_entry(stream_id, first_entry_id + i, 0, stamp, p)
        if isinstance(p, bytes)
        else prepare_entry(
            stream_id,
            first_entry_id + i,
            0,
            stamp,
            p.payload,
            key=p.key,
            headers=p.headers,
            sequence=p.sequence,
        )
        for i, p in enumerate(payloads)
    ]
