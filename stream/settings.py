"""One way to declare a setting: a dataclass field made by `setting()` carries its unit, check
and doc line beside its name, type and default. A settings class inherits `Settings`, whose
`__post_init__` checks every declared field the same way (type, then rule) and raises the
class's `error` naming the key; the config docs are generated from the same declarations."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn

from stream.errors import InvalidArgumentError, StreamError

_SPEC = "streamkeeper.setting"
# A unit a name ends with; "bytes/s" is a rate of bytes, named `..._bytes`.
_NAME_SUFFIX = {"ms": "_ms", "s": "_s", "bytes": "_bytes", "bytes/s": "_bytes"}


@dataclass(frozen=True)
class Check:
    """A rule one value must follow: `holds(value)` says whether it does, `rule` completes the
    message "KEY must be RULE"."""

    rule: str
    holds: Callable[[Any], bool]


POSITIVE = Check("> 0", lambda v: v > 0)
NON_NEGATIVE = Check(">= 0", lambda v: v >= 0)


def one_of(*choices: str) -> Check:
    """Returns the check that a string is one of `choices` (case kept)."""
    return Check(" or ".join(f'"{c}"' for c in choices), lambda v: v in choices)


@dataclass(frozen=True)
class Setting:
    """What a field declares besides its name, type and default: its unit ("" for counts,
    flags and names), its check (None: any value of its type), what it means to an operator,
    and how the docs show a default the code spells as "" (resolved from other keys)."""

    unit: str
    check: Check | None
    doc: str
    shown_default: str = ""


def setting(
    default: Any = dataclasses.MISSING,
    *,
    doc: str,
    unit: str = "",
    check: Check | None = None,
    shown_default: str = "",
    default_factory: Any = dataclasses.MISSING,
    hash: bool | None = None,
) -> Any:
    """Returns the dataclass field of one setting (no default: the key is required)."""
    if unit and unit not in _NAME_SUFFIX:
        raise StreamError("unknown setting unit", unit=unit)
    return dataclasses.field(
        default=default,
        default_factory=default_factory,
        hash=hash,
        metadata={_SPEC: Setting(unit, check, doc, shown_default)},
    )


def same_as(cls: type, name: str) -> Any:
    """Returns a new field declaring what `cls` declares for `name` (default, unit, check and
    doc), for a key that two settings classes share."""
    declared = cls.__dataclass_fields__[name]  # type: ignore[attr-defined]
    return dataclasses.field(
        default=declared.default,
        default_factory=declared.default_factory,
        metadata=declared.metadata,
    )


def declared(cls: type) -> Iterator[tuple[dataclasses.Field[Any], Setting]]:
    """Yields each field of a settings class with its declaration."""
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_SPEC)
        if spec is None:
            raise StreamError("settings field declared without setting()", key=f.name)
        if _unit_of_name(f.name) not in ("", spec.unit.split("/")[0]):
            raise StreamError("a setting's name ends in another unit", key=f.name, unit=spec.unit)
        yield f, spec


def _unit_of_name(name: str) -> str:
    """Returns the unit `name` ends with ("" for none): units last in names, the same way in
    every settings class."""
    return next((u for u, suffix in _NAME_SUFFIX.items() if name.endswith(suffix)), "")


def _type_name(f: dataclasses.Field[Any]) -> str:
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def _of_type(type_name: str, value: Any) -> bool:
    """Whether `value` is of the declared type (a bool is not a number; an int is a float)."""
    if type_name == "bool":
        return isinstance(value, bool)
    if type_name == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_name == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if type_name == "str":
        return isinstance(value, str)
    if type_name.startswith("dict[str, str]"):
        return isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        )
    return True  # a nested settings value checks itself


class Settings:
    """Base of the settings dataclasses: checks every field on construction (and on
    `dataclasses.replace`), then `check_together()` for rules that span keys."""

    __slots__ = ()
    error: ClassVar[type[StreamError]] = InvalidArgumentError

    def __post_init__(self) -> None:
        for f, spec in declared(type(self)):
            value = getattr(self, f.name)
            type_name = _type_name(f)
            if not _of_type(type_name, value):
                self.refuse(f.name, f"{f.name} must be of type {type_name}", value)
            if spec.check is not None and not _holds(spec.check, value):
                self.refuse(f.name, f"{f.name} must be {spec.check.rule}", value)
        self.check_together()

    def check_together(self) -> None:
        """Checks the rules between keys (none by default)."""

    def refuse(self, key: str, message: str, value: Any = None) -> NoReturn:
        """Raises the class's error for `key`."""
        raise self.error(message, key=key, value=value)


def _holds(check: Check, value: Any) -> bool:
    if isinstance(value, float) and math.isnan(value):
        return False
    return check.holds(value)
