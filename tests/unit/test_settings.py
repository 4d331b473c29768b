"""Settings are declared one way (stream.settings): every settings class checks each value's
type and rule on construction and names the key in a clear error; names end in their unit."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest

from stream.autorecovery.settings import AutoRecoverySettings
from stream.bookie.config import BookieConfig
from stream.client.options import ReaderOptions, WriterOptions
from stream.errors import InvalidArgumentError, StreamError
from stream.retention.service import RetentionSettings
from stream.settings import POSITIVE, Settings, declared, setting

SETTINGS_CLASSES = [
    BookieConfig,
    AutoRecoverySettings,
    WriterOptions,
    ReaderOptions,
    RetentionSettings,
]


@pytest.mark.parametrize("cls", SETTINGS_CLASSES, ids=lambda c: c.__name__)
def test_every_field_is_declared_with_a_doc_and_its_unit(cls: type) -> None:
    specs = dict((f.name, spec) for f, spec in declared(cls))
    assert specs.keys() == {f.name for f in dataclasses.fields(cls)}
    for name, spec in specs.items():
        assert spec.doc, name
        for suffix, unit in (("_ms", "ms"), ("_s", "s")):
            if name.endswith(suffix):
                assert spec.unit == unit, name


@pytest.mark.parametrize(
    ("cls", "key", "value", "message"),
    [
        (WriterOptions, "window_entries", 0, "window_entries must be > 0"),
        (WriterOptions, "window_entries", 1.5, "window_entries must be of type int"),
        (WriterOptions, "add_timeout_s", -1.0, "add_timeout_s must be > 0"),
        (WriterOptions, "add_timeout_s", float("nan"), "add_timeout_s must be > 0"),
        (ReaderOptions, "lac_poll_ms", True, "lac_poll_ms must be of type int"),
        (ReaderOptions, "read_timeout_s", "10s", "read_timeout_s must be of type float"),
        (RetentionSettings, "max_takeovers_per_round", -1, "must be >= 0"),
        (RetentionSettings, "interval_s", 0, "interval_s must be > 0"),
        (AutoRecoverySettings, "bookie_timeout_ms", 0, "bookie_timeout_ms must be > 0"),
        (AutoRecoverySettings, "replication_workers", -1, "replication_workers must be >= 0"),
    ],
)
def test_bad_value_is_refused_naming_the_key(cls: type, key: str, value: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as e:
        cls(**{key: value})
    assert e.value.context["key"] == key


def test_replace_checks_too() -> None:
    options = WriterOptions()
    with pytest.raises(InvalidArgumentError, match="batch_max_bytes"):
        dataclasses.replace(options, batch_max_bytes=0)
    assert options.batch_max_bytes == 4 << 20


def test_integers_are_taken_where_seconds_are_floats() -> None:
    assert RetentionSettings(interval_s=2).interval_s == 2


def test_the_bookie_shares_the_auto_recovery_declarations() -> None:
    ours = dict((f.name, (f.default, spec)) for f, spec in declared(BookieConfig))
    for f, spec in declared(AutoRecoverySettings):
        assert ours[f.name] == (f.default, spec)


def test_a_name_in_another_unit_than_declared_is_refused() -> None:
    @dataclass(frozen=True)
    class Wrong(Settings):
        delay_ms: float = setting(1.0, unit="s", check=POSITIVE, doc="a delay")

    with pytest.raises(StreamError, match="another unit"):
        Wrong()


def test_a_field_without_a_declaration_is_refused() -> None:
    @dataclass(frozen=True)
    class Undeclared(Settings):
        count: int = 3

    with pytest.raises(StreamError, match="without setting"):
        Undeclared()
