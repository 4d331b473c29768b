"""Runs `streamctl` in-process against the real ZooKeeper of tests/conftest.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stream.cli.main import main

Streamctl = Callable[..., int]


@pytest.fixture
def streamctl(metadata_root: str) -> Streamctl:
    """Returns `run(*args) -> exit code` of `streamctl --metadata ROOT ARGS...`, a usage
    error's SystemExit included."""

    def run(*args: str) -> int:
        try:
            return main(["--metadata", metadata_root, *args])
        except SystemExit as e:
            return int(e.code or 0)

    return run
