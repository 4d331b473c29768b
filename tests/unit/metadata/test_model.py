"""The metadata values: JSON round trips, validation, malformed znodes (pure, no ZooKeeper)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream.bookie.config import BookieConfig
from stream.errors import InvalidArgumentError, MetadataError
from stream.metadata import (
    AcceptedLoss,
    BookieRegistration,
    Fragment,
    RetentionPolicy,
    StreamMeta,
    StreamState,
    WriterInfo,
    validate_bookie_id,
    validate_stream_name,
)
from stream.metadata.model import MAX_ACCEPTED_LOSSES, MAX_TERM_HISTORY, compact_term_history
from stream.protocol import DEFAULT_MAX_ENTRY_BYTES

_name = st.from_regex(r"[A-Za-z0-9._-]{1,40}", fullmatch=True).filter(
    lambda n: n not in (".", "..")
)
_bookie = st.from_regex(r"[a-z0-9-]{1,12}(:[0-9]{1,5})?", fullmatch=True)
_nat = st.integers(0, 2**62)


@st.composite
def _metas(draw: st.DrawFn) -> StreamMeta:
    aq = draw(st.integers(1, 5))
    wq = draw(st.integers(aq, 6))
    e = draw(st.integers(wq, 8))
    terms = sorted(draw(st.sets(st.integers(1, 1000), max_size=5)))
    firsts = sorted(draw(st.lists(_nat, min_size=len(terms), max_size=len(terms))))
    return StreamMeta(
        name=draw(_name),
        id=draw(st.integers(1, 2**63 - 1)),
        ensemble=e,
        write_quorum=wq,
        ack_quorum=aq,
        fragment_max_entries=draw(st.integers(1, 2**40)),
        fragment_max_bytes=draw(st.integers(1, 2**40)),
        fragment_max_age_s=draw(st.one_of(st.none(), st.floats(0.001, 1e9))),
        retention=draw(
            st.one_of(
                st.none(),
                st.builds(
                    RetentionPolicy,
                    max_age_s=st.one_of(st.none(), st.floats(0.001, 1e9)),
                    max_bytes=st.one_of(st.none(), st.integers(1, 2**50)),
                ),
            )
        ),
        term=(terms[-1] if terms else 0) + draw(st.integers(0, 3)),
        state=draw(st.sampled_from(list(StreamState))),
        first_entry_id=draw(_nat),
        term_history=tuple(zip(terms, firsts, strict=True)),
        created_ms=draw(_nat),
    )


@given(_metas(), st.lists(st.uuids().map(str), max_size=4).map(tuple))
def test_stream_meta_json_round_trips(meta: StreamMeta, op_ids: tuple[str, ...]) -> None:
    data = meta.to_json(op_ids)
    assert StreamMeta.from_json(data) == meta
    assert StreamMeta.from_json_with_ops(data) == (meta, op_ids)
    assert meta.to_json(op_ids) == data  # canonical: equal values, equal bytes


def test_stream_meta_reads_the_single_op_id_of_older_versions() -> None:
    body = json.loads(StreamMeta("s", 1, 3, 3, 2, 10, 1000).to_json())
    old = json.dumps({**body, "op_id": "abc"}).encode()
    assert StreamMeta.from_json_with_ops(old)[1] == ("abc",)


@given(
    first=_nat,
    ensemble=st.lists(_bookie, min_size=1, max_size=6, unique=True),
    length=st.one_of(st.none(), st.integers(0, 10**6)),
    size=st.one_of(st.none(), _nat),
)
def test_fragment_json_round_trips(
    first: int, ensemble: list[str], length: int | None, size: int | None
) -> None:
    fragment = Fragment(
        first_entry_id=first,
        ensemble=tuple(ensemble),
        created_ms=5,
        last_entry_id=None if length is None else first + length,
        bytes=size,
        first_timestamp_ms=None if length is None else 10,
        last_timestamp_ms=None if length is None else 20,
    )
    assert Fragment.from_json(fragment.to_json()) == fragment
    assert fragment.closed == (length is not None)


def test_fragment_accepts_a_list_and_checks_its_ensemble() -> None:
    assert Fragment(0, ["a", "b"]).ensemble == ("a", "b")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        Fragment(0, ("a", "a"))
    with pytest.raises(InvalidArgumentError):
        Fragment(0, ())
    with pytest.raises(InvalidArgumentError):
        Fragment(-1, ("a",))
    with pytest.raises(InvalidArgumentError):
        Fragment(5, ("a",), last_entry_id=4)
    with pytest.raises(InvalidArgumentError):
        Fragment(0, ("a/b",))


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "a b", "x" * 256, "ü", "a\x00", None, 7, "../x"]
)
def test_invalid_stream_names(name: object) -> None:
    with pytest.raises(InvalidArgumentError):
        validate_stream_name(name)


@pytest.mark.parametrize("name", ["a", "orders", "A.b-c_d", "x" * 255, "..."])
def test_valid_stream_names(name: str) -> None:
    assert validate_stream_name(name) == name


def test_bookie_ids() -> None:
    assert validate_bookie_id("10.0.0.1:3181") == "10.0.0.1:3181"
    for bad in ("", ".", "..", "a/b", "x" * 256, None):
        with pytest.raises(InvalidArgumentError):
            validate_bookie_id(bad)


@pytest.mark.parametrize(
    ("e", "wq", "aq"),
    [(2, 3, 1), (3, 2, 3), (3, 3, 0), (0, 0, 0), (True, 1, 1), (65, 1, 1), (3.0, 3, 2)],
)
def test_stream_meta_refuses_bad_quorums(e: object, wq: object, aq: object) -> None:
    with pytest.raises(InvalidArgumentError):
        StreamMeta("s", 1, e, wq, aq, 10, 10)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes",
    [
        {"fragment_max_entries": 0},
        {"fragment_max_bytes": -1},
        {"fragment_max_age_s": 0},
        {"fragment_max_age_s": float("inf")},
        {"retention": {"max_bytes": 1}},
        {"term": -1},
        {"state": "CLOSED"},
        {"first_entry_id": -1},
        {"term_history": ((1, 0),)},  # term 1 above the current term 0
        {"term": 3, "term_history": ((2, 5), (1, 9))},
        {"term": 3, "term_history": ((1, 5), (2, 4))},
        {"term": 3, "term_history": ((1,),)},
        {"id": 0},
        {"id": 2**63},
    ],
)
def test_stream_meta_refuses_bad_values(changes: dict[str, object]) -> None:
    base = StreamMeta("s", 1, 3, 3, 2, 10, 10)
    with pytest.raises(InvalidArgumentError):
        base.replace(**changes)


def test_retention_policy_checks() -> None:
    assert RetentionPolicy() == RetentionPolicy(None, None)
    for bad in ({"max_age_s": 0}, {"max_age_s": -1.0}, {"max_bytes": 0}, {"max_bytes": 1.5}):
        with pytest.raises(InvalidArgumentError):
            RetentionPolicy(**bad)  # type: ignore[arg-type]


def test_same_config_ignores_term_state_and_history() -> None:
    meta = StreamMeta("s", 1, 3, 3, 2, 10, 10, retention=RetentionPolicy(max_bytes=5))
    moved = meta.replace(id=9, term=4, state=StreamState.SEALED, term_history=((4, 7),))
    assert meta.same_config(moved)
    assert not meta.same_config(meta.replace(ack_quorum=1))
    assert not meta.same_config(meta.replace(retention=None))


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[1, 2]",
        b"\xff\xfe",
        b"{}",
        json.dumps({"name": "s", "id": 1, "ensemble": 3, "write_quorum": 4}).encode(),
        json.dumps(
            {
                "name": "s",
                "id": 1,
                "ensemble": 3,
                "write_quorum": 3,
                "ack_quorum": 2,
                "fragment_max_entries": 1,
                "fragment_max_bytes": 1,
                "retention": [1],
            }
        ).encode(),
    ],
)
def test_malformed_meta_is_a_metadata_error(data: bytes) -> None:
    with pytest.raises(MetadataError):
        StreamMeta.from_json(data)
    with pytest.raises(MetadataError):
        Fragment.from_json(data)
    with pytest.raises(MetadataError):
        WriterInfo.from_json(data)
    with pytest.raises(MetadataError):
        BookieRegistration.from_json(data)


def test_writer_and_registration_round_trip() -> None:
    writer = WriterInfo(writer_id="w-1", host="h", pid=42, term=3)
    assert WriterInfo.from_json(writer.to_json()) == writer
    reg = BookieRegistration(address="127.0.0.1:3181", read_only=True, free_bytes=1 << 40)
    assert BookieRegistration.from_json(reg.to_json()) == reg
    assert BookieRegistration.from_json(b'{"address": "h:1"}') == BookieRegistration("h:1")


def test_registration_journal_mode_round_trips_and_defaults_to_on() -> None:
    reg = BookieRegistration("h:1", journal_write_data=False)
    assert BookieRegistration.from_json(reg.to_json()) == reg
    # A registration written before the field existed: the journal was on (the default).
    assert BookieRegistration.from_json(b'{"address":"h:1","read_only":false}').journal_write_data
    with pytest.raises(MetadataError):
        BookieRegistration.from_json(b'{"address":"h:1","journal_write_data":"no"}')


def test_registration_max_entry_bytes_round_trips_and_defaults_to_the_setting() -> None:
    reg = BookieRegistration("h:1", max_entry_bytes=65_536)
    assert BookieRegistration.from_json(reg.to_json()) == reg
    # Written before the field existed: the bookie.toml default.
    old = BookieRegistration.from_json(b'{"address":"h:1"}')
    assert old.max_entry_bytes == DEFAULT_MAX_ENTRY_BYTES == BookieConfig.max_entry_bytes
    with pytest.raises(MetadataError):
        BookieRegistration.from_json(b'{"address":"h:1","max_entry_bytes":true}')


def test_accepted_losses_round_trip_and_leave_older_metas_unchanged() -> None:
    meta = StreamMeta("s", 1, 3, 3, 2, 100, 1 << 20, term=4, state=StreamState.IN_RECOVERY)
    assert b"accepted_losses" not in meta.to_json()  # bytes as before the field existed
    loss = AcceptedLoss(4, 54, 8245, ("b1", "b2"), "ops@host", 1_700_000_000_000)
    with_loss = meta.replace(accepted_losses=(loss,))
    assert StreamMeta.from_json(with_loss.to_json()) == with_loss
    assert AcceptedLoss.from_dict(loss.to_dict()) == loss
    with pytest.raises(InvalidArgumentError):
        AcceptedLoss(4, 54, 53, (), "ops", 0)  # an empty range
    with pytest.raises(InvalidArgumentError):
        AcceptedLoss(4, 54, 60, ("b/1",), "ops", 0)
    with pytest.raises(InvalidArgumentError):
        meta.replace(accepted_losses=(loss,) * (MAX_ACCEPTED_LOSSES + 1))
    body = json.loads(with_loss.to_json())
    body["accepted_losses"] = [{"term": 4}]
    with pytest.raises(MetadataError):
        StreamMeta.from_json(json.dumps(body).encode())


def test_term_history_compaction_keeps_what_readers_need() -> None:
    history = [(t, 10 * t) for t in range(1, 41)]  # term t starts at entry 10 t
    # The newest MAX_TERM_HISTORY pairs, with the newest last.
    kept = compact_term_history(history, first_retained=0)
    assert kept == tuple(history[-MAX_TERM_HISTORY:])
    # Terms wholly below the first retained entry go; the one holding it stays.
    assert compact_term_history(history[:10], first_retained=45) == tuple(history[3:10])
    assert compact_term_history(history[:10], first_retained=40) == tuple(history[3:10])
    assert compact_term_history(history[:10], first_retained=1_000) == (history[9],)
    assert compact_term_history([], first_retained=5) == ()
    # For any boot term, the first kept term above it starts at or after the one it replaces
    # (a later fixed end: self-repair still covers every entry a bookie may have lost).
    for boot in range(0, 41):
        full = next((f for t, f in history if t > boot), None)
        compact = next((f for t, f in kept if t > boot), None)
        assert (full is None) == (compact is None)
        assert full is None or compact >= full  # type: ignore[operator]
