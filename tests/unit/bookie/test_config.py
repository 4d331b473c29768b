"""bookie.toml validation: every bad key or value is refused with a ConfigError naming it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from stream.bookie.config import DEFAULTS, BookieConfig
from stream.errors import ConfigError

REQUIRED = {"bookie_id": "bookie-1", "listen": "127.0.0.1:3181", "metadata": "127.0.0.1:2181/sk"}


def config(**overrides: Any) -> BookieConfig:
    return BookieConfig.from_dict({**REQUIRED, **overrides})


def test_defaults_are_valid_and_documented_paths() -> None:
    c = config()
    assert c.journal_write_data is True
    assert c.auto_fix_cookie is False
    assert c.data_path == Path("/var/lib/streamkeeper/bookie-1")
    assert c.directories == {
        "journal": Path("/var/lib/streamkeeper/bookie-1/journal"),
        "ledgers": Path("/var/lib/streamkeeper/bookie-1/ledgers"),
        "index": Path("/var/lib/streamkeeper/bookie-1/index"),
    }
    assert set(DEFAULTS) == {f.name for f in dataclasses.fields(BookieConfig)} - set(REQUIRED)


def test_directories_can_be_set_apart(tmp_path: Path) -> None:
    c = config(data_dir=str(tmp_path), journal_dir=str(tmp_path / "fast"))
    assert c.journal_path == tmp_path / "fast"
    assert c.ledger_path == tmp_path / "ledgers"


@pytest.mark.parametrize("key", sorted(REQUIRED))
def test_missing_required_key(key: str) -> None:
    raw = dict(REQUIRED)
    del raw[key]
    with pytest.raises(ConfigError) as e:
        BookieConfig.from_dict(raw)
    assert e.value.context["key"] == key
    assert key in str(e.value)


def test_unknown_key_is_named() -> None:
    with pytest.raises(ConfigError) as e:
        config(jornal_write_data=False)
    assert e.value.context["key"] == "jornal_write_data"
    assert "jornal_write_data" in str(e.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("bookie_id", ""),
        ("bookie_id", "a/b"),
        ("bookie_id", "x" * 129),
        ("listen", "localhost"),
        ("listen", "127.0.0.1:0"),
        ("listen", "127.0.0.1:70000"),
        ("listen", ":3181"),
        ("metrics_listen", "nope"),
        ("metadata", "zookeeper"),
        ("journal_write_data", "yes"),
        ("journal_write_data", 1),
        ("flush_interval_ms", 0),
        ("flush_interval_ms", -5),
        ("flush_interval_ms", 1.5),
        ("flush_interval_ms", True),
        ("max_entry_bytes", 64 << 20),
        ("entry_log_size_limit_bytes", 1024),
        ("disk_usage_threshold", 0.0),
        ("disk_usage_threshold", 1.5),
        ("disk_usage_threshold", float("nan")),
        ("minor_compaction_threshold", 1.0),
        ("journal_max_group_wait_ms", -1),
        ("read_lac_max_wait_ms", 0),
        ("add_max_inflight_batches", 0),
        ("metadata_session_timeout_ms", 0),
        ("shutdown_grace_ms", -1),
        ("log_level", "verbose"),
        ("event_loop", "trio"),
        ("data_dir", 5),
        ("autorecovery", "on"),
        ("lost_bookie_recovery_delay_ms", -1),
        ("open_stream_replication_delay_ms", -1),
        ("audit_interval_ms", 0),
        ("scrub_interval_ms", 0),
        ("scrub_full_interval_ms", -1),
        ("replication_workers", -1),
        ("replication_rate_bytes", -1),
        ("max_takeovers_per_audit", -1),
        ("bookie_timeout_ms", 0),
    ],
)
def test_bad_value_is_named(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as e:
        config(**{key: value})
    assert e.value.context["key"] == key
    assert key in str(e.value)


def test_every_auto_recovery_setting_is_a_bookie_key() -> None:
    settings = config(max_takeovers_per_audit=3, bookie_timeout_ms=2500).autorecovery_settings()
    assert settings.max_takeovers_per_audit == 3
    assert settings.bookie_timeout_ms == 2500


def test_float_keys_take_integers() -> None:
    assert config(journal_max_group_wait_ms=2).journal_max_group_wait_ms == 2.0
    assert config(disk_usage_threshold=1).disk_usage_threshold == 1.0


def test_metrics_can_be_turned_off() -> None:
    assert config(metrics_listen="").metrics_listen == ""


def test_load_round_trips_to_toml(tmp_path: Path) -> None:
    c = config(data_dir=str(tmp_path / 'd "q"'), journal_write_data=False, flush_interval_ms=50)
    path = tmp_path / "bookie.toml"
    path.write_text(c.to_toml())
    assert BookieConfig.load(path) == c


def test_load_reports_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        BookieConfig.load(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("bookie_id = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        BookieConfig.load(bad)
