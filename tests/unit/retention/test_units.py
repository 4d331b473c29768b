"""Human sizes and durations (stream/retention/units.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream.errors import InvalidArgumentError
from stream.retention.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10GiB", 10 << 30),
        ("10 GiB", 10 << 30),
        ("5mib", 5 << 20),
        ("1.5GiB", 3 << 29),
        ("4096", 4096),
        ("100B", 100),
        ("2KB", 2000),
        ("3MB", 3_000_000),
        ("1TiB", 1 << 40),
        (" 7 KiB ", 7 << 10),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text", ["", "GiB", "10 GiBs", "-1", "0", "0.5", "1.0000001KiB", "ten", "1e9", "10 XB", "5 5"]
)
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_size(text)


@pytest.mark.parametrize(
    ("value", "shown"),
    [(10 << 30, "10 GiB"), (5 << 20, "5 MiB"), (1536 << 20, "1.5 GiB"), (100, "100 B")],
)
def test_format_size(value: int, shown: str) -> None:
    assert format_size(value) == shown


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("7d", 7 * 86400),
        ("90s", 90),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("500ms", 0.5),
        ("3600", 3600),
        ("2w", 14 * 86400),
        ("1.5h", 5400),
        ("1D", 86400),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "d", "7x", "-1s", "0s", "1h30", "h1", "7 days", "1s1"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(7 * 86400, "7d"), (5400, "1h30m"), (0.5, "500ms"), (2.5, "2.5s"), (90061, "1d1h1m1s")],
)
def test_format_duration(seconds: float, shown: str) -> None:
    assert format_duration(seconds) == shown


@given(st.integers(1, 1 << 50))
def test_sizes_round_trip_when_shown_exactly(value: int) -> None:
    shown = format_size(value)
    if "." not in shown:
        assert parse_size(shown.replace(" ", "")) == value


@given(st.integers(1, 10**9))
def test_whole_second_durations_round_trip(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds
