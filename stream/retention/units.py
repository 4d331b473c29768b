"""Human sizes and durations for retention policies: `10GiB`, `500MB`, `7d`, `90m`, `1h30m`.

Sizes take binary (KiB, MiB, GiB, TiB, PiB) and decimal (KB, MB, GB, TB, PB) units, `B`, or
none (bytes). Durations take `ms`, `s`, `m`, `h`, `d`, `w` (several may follow each other, as
in `1h30m`), or none (seconds). Anything else raises `InvalidArgumentError`, never guesses."""

from __future__ import annotations

import math
import re

from stream.errors import InvalidArgumentError

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "pb": 1000**5,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "pib": 1 << 50,
}
# Shown by `format_size`: the largest binary unit that divides evenly, else one decimal.
_SIZE_SHOWN = (
    ("PiB", 1 << 50),
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
)
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")

_DURATION_UNITS_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d|w)", re.IGNORECASE)
_BARE_NUMBER = re.compile(r"^\s*[0-9]+(?:\.[0-9]+)?\s*$")
# Largest values accepted: far beyond any disk or lifetime, small enough to stay exact.
MAX_BYTES = 1 << 62
MAX_DURATION_S = 1000 * 365 * 86400


def parse_size(text: str) -> int:
    """Returns the number of bytes that `text` (e.g. `10GiB`, `1.5 MB`, `4096`) names; raises
    `InvalidArgumentError` for anything that is not a positive whole number of bytes."""
    if not isinstance(text, str):
        raise InvalidArgumentError("size must be text such as 10GiB", value=text)
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise InvalidArgumentError(
            "size must be a number with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)",
            value=text,
        )
    number = match.group(1)
    multiplier = _SIZE_UNITS[unit]
    if "." in number:
        whole, fraction = number.split(".")
        # Exact arithmetic: 1.5GiB is 1610612736 bytes, not a float's rounding of it.
        numerator = int(whole + fraction) * multiplier
        denominator: int = 10 ** len(fraction)  # int ** int is typed Any (negative powers)
        if numerator % denominator:
            raise InvalidArgumentError("size must be a whole number of bytes", value=text)
        value = numerator // denominator
    else:
        value = int(number) * multiplier
    if not 0 < value <= MAX_BYTES:
        raise InvalidArgumentError("size must be > 0 and at most 4 EiB", value=text)
    return value


def format_size(value: int) -> str:
    """Returns `value` bytes for people: `10 GiB` when a binary unit divides it evenly, else
    one decimal (`1.3 GiB`), or plain bytes below 1 KiB."""
    for unit, size in _SIZE_SHOWN:
        if value >= size:
            if value % size == 0:
                return f"{value // size} {unit}"
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def parse_duration(text: str) -> float:
    """Returns the seconds that `text` (e.g. `7d`, `90s`, `1h30m`, `500ms`, `3600`) names;
    raises `InvalidArgumentError` for anything that is not a positive duration."""
    if not isinstance(text, str):
        raise InvalidArgumentError("duration must be text such as 7d", value=text)
    compact = text.strip()
    if _BARE_NUMBER.match(compact):
        seconds = float(compact)
    else:
        position = 0
        seconds = 0.0
        for part in _DURATION_PART.finditer(compact):
            if part.start() != position:
                break
            seconds += float(part.group(1)) * _DURATION_UNITS_S[part.group(2).lower()]
            position = part.end()
            while position < len(compact) and compact[position] == " ":
                position += 1
        if position != len(compact) or position == 0:
            raise InvalidArgumentError(
                "duration must be a number with units ms, s, m, h, d, w (e.g. 7d, 1h30m)",
                value=text,
            )
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_DURATION_S):
        raise InvalidArgumentError("duration must be > 0 and at most 1000 years", value=text)
    return seconds


def format_duration(seconds: float) -> str:
    """Returns `seconds` for people, in days, hours, minutes and seconds that add up exactly
    (`7d`, `1h30m`, `2.5s`); `parse_duration` reads it back."""
    if seconds < 1 or seconds != int(seconds):
        if seconds < 1:
            return f"{round(seconds * 1000, 3):g}ms"
        return f"{seconds:g}s"
    remaining = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if remaining >= size:
            parts.append(f"{remaining // size}{unit}")
            remaining %= size
    return "".join(parts)
