"""The bookie's test-only switches (`stream.bookie.unsafe`) reach a bookie process only through
the hidden `bookie start --unsafe-test-only-skip` option: not listed by `--help`, checked, and
never read from the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stream.bookie import process
from stream.bookie.unsafe import SAFE, UNSAFE_SKIP_OPTION, UnsafeSkips
from stream.cli.main import main

CONFIG = 'bookie_id = "b1"\nlisten = "127.0.0.1:1"\nmetadata = "127.0.0.1:2/x"\n'


@pytest.fixture
def started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[UnsafeSkips]]:
    """A bookie.toml, and the switches each `run_bookie` call got (no bookie runs)."""
    config = tmp_path / "bookie.toml"
    config.write_text(CONFIG)
    calls: list[UnsafeSkips] = []

    def run_bookie(config: Any, *, log_json: bool | None = None, unsafe: UnsafeSkips) -> int:
        calls.append(unsafe)
        return 0

    monkeypatch.setattr(process, "run_bookie", run_bookie)
    return config, calls


def test_the_option_names_the_switches(started: tuple[Path, list[UnsafeSkips]]) -> None:
    config, calls = started
    assert main(["bookie", "start", "--config", str(config)]) == 0
    assert main(["bookie", "start", "--config", str(config), UNSAFE_SKIP_OPTION, "trim_check"]) == 0
    assert calls == [SAFE, UnsafeSkips(frozenset({"trim_check"}))]


def test_the_environment_turns_nothing_off(
    started: tuple[Path, list[UnsafeSkips]], monkeypatch: pytest.MonkeyPatch
) -> None:
    config, calls = started
    # The variable that once carried the switches to bookie processes.
    monkeypatch.setenv("STREAMKEEPER_UNSAFE_BP46_SKIP", "trim_check")
    assert main(["bookie", "start", "--config", str(config)]) == 0
    assert calls == [SAFE]


def test_an_unknown_switch_stops_the_bookie(
    started: tuple[Path, list[UnsafeSkips]], capsys: pytest.CaptureFixture[str]
) -> None:
    config, calls = started
    argv = ["bookie", "start", "--config", str(config), UNSAFE_SKIP_OPTION, "trim_chek"]
    assert main(argv) != 0
    assert "unknown unsafe switch(es) trim_chek" in capsys.readouterr().err
    assert calls == []


def test_the_option_is_not_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bookie", "start", "--help"])
    assert "unsafe" not in capsys.readouterr().out.lower()
