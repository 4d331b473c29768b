"""What a bookie refuses because neither metadata nor its data justify it: an add replacing an
acknowledged entry with other bytes (the recovery write-back of the same entry, or of an earlier
term's NOOP|TRUNCATE as a plain NOOP, still allowed), and a trim beyond metadata's first
retained entry."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from stream.protocol.checksum import entry_checksum
from stream.protocol.codes import EntryFlag
from stream.protocol.justified import overwrite_refusal, trim_refusal

STREAM = 7
NOOP = int(EntryFlag.NOOP)
NOOP_TRUNCATE = int(EntryFlag.NOOP | EntryFlag.TRUNCATE)


@dataclass(frozen=True)
class E:
    entry_id: int
    flags: int
    timestamp_ms: int
    payload: bytes
    crc32c: int


def entry(entry_id: int, payload: bytes = b"real", flags: int = 0, ts: int = 1000) -> E:
    return E(entry_id, flags, ts, payload, entry_checksum(STREAM, entry_id, flags, ts, payload))


def test_above_the_lac_anything_may_be_written() -> None:
    # An earlier term's unacknowledged entry is overwritten by a recovery write-back.
    assert overwrite_refusal(entry(5, b"old"), entry(5, b"new"), lac=4) is None
    assert overwrite_refusal(None, entry(5, flags=NOOP_TRUNCATE, payload=b""), lac=4) is None


def test_at_or_below_the_lac_the_same_entry_again_is_allowed() -> None:
    for lac in (2, 3, 100):
        assert overwrite_refusal(entry(2), entry(2), lac) is None
        assert overwrite_refusal(None, entry(2), lac) is None  # not held here


def test_a_forged_entry_with_a_correct_checksum_is_refused() -> None:
    reason = overwrite_refusal(entry(2, b"real-2"), entry(2, b"FORGED"), lac=3)
    assert reason is not None and "at or below the LAC 3" in reason
    # Same payload, other timestamp or flags: other bytes too.
    assert overwrite_refusal(entry(2), entry(2, ts=999), lac=2) is not None
    assert overwrite_refusal(entry(2), entry(2, flags=NOOP), lac=2) is not None


def test_an_earlier_terms_truncate_noop_written_back_as_a_plain_noop_is_allowed() -> None:
    stored = entry(2, b"", flags=NOOP_TRUNCATE)
    assert overwrite_refusal(stored, entry(2, b"", flags=NOOP), lac=5) is None
    # Not the same no-op (other timestamp), or a plain entry over it: refused.
    assert overwrite_refusal(stored, entry(2, b"", flags=NOOP, ts=5), lac=5) is not None
    assert overwrite_refusal(stored, entry(2, b"data"), lac=5) is not None
    # The reverse (a TRUNCATE over a plain no-op) would delete what follows: refused.
    assert overwrite_refusal(entry(2, b"", flags=NOOP), stored, lac=5) is not None


def test_a_truncate_entry_at_or_below_the_lac_is_refused_even_when_held() -> None:
    stored = entry(2, b"", flags=NOOP_TRUNCATE)
    for held in (None, stored):
        reason = overwrite_refusal(held, stored, lac=2)
        assert reason is not None and "would delete acknowledged entries" in reason
    assert overwrite_refusal(stored, stored, lac=1) is None


@given(
    st.binary(max_size=8),
    st.binary(max_size=8),
    st.sampled_from([0, NOOP, NOOP_TRUNCATE]),
    st.sampled_from([0, NOOP]),
    st.integers(0, 3),
    st.integers(-1, 6),
)
def test_only_the_same_bytes_or_the_plain_noop_replace_an_acknowledged_entry(
    old: bytes, new: bytes, old_flags: int, new_flags: int, ts_delta: int, lac: int
) -> None:
    stored = entry(3, old, flags=old_flags)
    incoming = entry(3, new, flags=new_flags, ts=1000 + ts_delta)
    same = (old, old_flags, 0) == (new, new_flags, ts_delta)
    plain_noop = old_flags == NOOP_TRUNCATE and (old, NOOP, 0) == (new, new_flags, ts_delta)
    allowed = lac < 3 or same or plain_noop
    assert (overwrite_refusal(stored, incoming, lac) is None) is allowed


def test_a_trim_never_goes_beyond_metadatas_first_retained_entry() -> None:
    assert trim_refusal(5, 5) is None
    assert trim_refusal(0, 0) is None
    reason = trim_refusal(6, 5)
    assert reason == "Trim before 6 goes beyond metadata's first retained entry 5"
    assert trim_refusal(1_000_000, 0) is not None
    # A deleted stream (metadata has none): everything may go.
    assert trim_refusal((1 << 63) - 1, None) is None
