"""`streamctl` imports only the module of the command it runs: `--help` lists every command from
the table of `stream.cli.commands`, and each area's module is imported once one of its commands
is parsed (the simulator's modules alone cost every call a third of a second)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import pytest

from stream.cli.commands import COMMANDS, LazyCommands
from stream.cli.main import build_parser

# Modules no command but their own needs (the simulator, a bookie, the sandbox), the other
# areas' command modules, and libraries that connecting needs.
_HEAVY = (
    "stream.sim",
    "stream.bookie",
    "stream.sandbox",
    "stream.client.client",
    "stream.metadata.connection",
    "stream.cli.bookie",
    "stream.cli.streams",
    "stream.cli.bench",
    "stream.cli.sim",
    "grpc",
    "kazoo",
    "cryptography",
)


def _imported_after(argv: list[str]) -> list[str]:
    """Returns the heavy modules imported by a fresh interpreter that parses `argv` with
    `streamctl`'s parser (`--help` included: its SystemExit is caught)."""
    code = (
        "import contextlib, json, sys\n"
        "from stream.cli.main import build_parser\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(None):\n"
        f"    build_parser().parse_args({argv!r})\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({_HEAVY!r}))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def _commands(parser: argparse.ArgumentParser) -> LazyCommands:
    (action,) = (a for a in parser._actions if isinstance(a, LazyCommands))
    return action


def test_help_lists_every_command_with_its_help() -> None:
    text = build_parser().format_help()
    # A command's line is indented by four; its help's continuation lines, further.
    listed = re.findall(r"^    (\S+)", text, flags=re.MULTILINE)
    assert [name for name in listed if name in COMMANDS] == list(COMMANDS)
    for name, command in COMMANDS.items():
        assert command.help.split()[0] in text.split(name, 1)[1]


def test_help_and_parsing_import_only_the_chosen_commands_module() -> None:
    assert _imported_after(["--help"]) == []
    assert _imported_after(["streams"]) == ["stream.cli.streams"]
    bookie = _imported_after(["bookie", "start", "--config", "b.toml"])
    assert bookie == ["stream.bookie", "stream.bookie.unsafe", "stream.cli.bookie"]


def test_every_module_registers_exactly_its_commands() -> None:
    # load_all fails on a command its module did not register, or one missing from the table.
    parser = build_parser(load_all=True)
    commands = _commands(parser)
    for name in COMMANDS:
        real = commands.choices[name]  # a placeholder has no handler and no subcommands
        nested = any(isinstance(a, argparse._SubParsersAction) for a in real._actions)
        assert real.get_default("handler") is not None or nested, name
        assert "--metadata" in real._option_string_actions, name  # the global options


def test_a_command_missing_from_the_table_is_refused() -> None:
    parser = argparse.ArgumentParser(prog="streamctl")
    sub = parser.add_subparsers(dest="command", action=LazyCommands)
    assert isinstance(sub, LazyCommands)
    sub.add_commands({"streams": COMMANDS["streams"]})  # `create` & co. are not in this table
    with pytest.raises(ValueError, match="not a command of streams"):
        sub.load("streams")
