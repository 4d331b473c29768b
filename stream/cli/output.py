"""What `streamctl` prints: tables for people, JSON for scripts (`--output json`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import Any

from rich.console import Console

# Wide enough that no table row is ever folded when stdout is a pipe or a file.
_UNWRAPPED_WIDTH = 100_000


def wants_json(args: argparse.Namespace) -> bool:
    """Returns whether the command was asked for `--output json`."""
    return bool(getattr(args, "output", "text") == "json")


def supports_json(parser: argparse.ArgumentParser) -> None:
    """Marks the command of `parser` as one that honours `--output json` (others refuse it)."""
    parser.set_defaults(json_output=True)


def runs_until_stopped(parser: argparse.ArgumentParser) -> None:
    """Marks the command of `parser` as a service: its logs are its output, kazoo's reports of
    lost ZooKeeper connections included."""
    parser.set_defaults(service=True)


def console(*, stderr: bool = False) -> Console:
    """Returns a console for tables: at the terminal's width on a terminal, unwrapped
    otherwise (scripts grep whole rows)."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else _UNWRAPPED_WIDTH
    return Console(stderr=stderr, width=width, soft_wrap=width is not None)


def print_json(value: Any) -> None:
    """Writes `value` as one JSON line on stdout."""
    sys.stdout.write(json.dumps(value, sort_keys=True) + "\n")


def print_json_lines(values: Iterable[Any]) -> None:
    """Writes each of `values` as its own JSON line on stdout (lists, so that scripts can
    stream them)."""
    for value in values:
        print_json(value)
