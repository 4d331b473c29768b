"""The table of `streamctl`'s commands, and the subcommand action that imports a command's module
only when that command runs.

`streamctl --help` lists every command from this table alone; `streamctl bookie start` imports
`stream.cli.bookie` and nothing of the other areas (the simulator's modules alone took about a
third of a second of every call, and of every bookie's start). Each area's module keeps its own
`register(subparsers)`, which adds its commands' real parsers (without `help=`: it is here)."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    _SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:  # generic only in the stubs
    _SubParsers = argparse._SubParsersAction


class Command(NamedTuple):
    module: str  # under stream.cli: its `register(subparsers)` adds the command
    help: str


# In help order.
COMMANDS: dict[str, Command] = {
    "bookie": Command("bookie", "run or inspect a bookie"),
    "bookies": Command("bookie", "list the bookies: id, address, state, journal mode, free space"),
    "sandbox": Command("sandbox", "run ZooKeeper and bookies on this machine"),
    "create": Command("streams", "create a stream"),
    "append": Command("streams", "append --message values, or else one entry per line of stdin"),
    "tail": Command("streams", "print entries as they are acknowledged"),
    "info": Command("streams", "show a stream's term, state, LAC, fragments and term history"),
    "trim": Command("streams", "drop whole fragments below an entry id"),
    "seal": Command("streams", "recover a stream and seal it for good"),
    "recover": Command(
        "streams",
        "end a recovery stuck on bookies in limbo by giving up what they may have lost "
        "(--accept-loss; docs/design.md §4)",
    ),
    "delete": Command("streams", "delete a stream and its data"),
    "streams": Command("streams", "list the streams"),
    "cursors": Command("cursors", "consumers' durable cursors: positions, lag, reset, delete"),
    "retention": Command("retention", "retention policies and the retention service"),
    "autorecovery": Command(
        "autorecovery", "the auditor and replication workers (docs/design.md §7)"
    ),
    "underreplicated": Command(
        "autorecovery", "list the under-replicated fragments and who repairs them"
    ),
    "certs": Command("certs", "TLS certificates: a CA and what it issues"),
    "bench": Command("bench", "client benchmarks on a sandbox"),
    "sim": Command("sim", "run the deterministic simulator and its safety checker"),
}


class LazyCommands(_SubParsers):
    """Subcommands that start as placeholders carrying only their help; the one chosen on the
    command line is replaced by its module's real parser just before argparse parses it.

    `prepare` is applied to each real parser when its module is loaded (the global options)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prepare: Callable[[argparse.ArgumentParser], None] = lambda parser: None
        self._unloaded: dict[str, str] = {}  # command -> its module, while a placeholder
        self._loading: str | None = None

    def add_commands(self, commands: dict[str, Command]) -> None:
        for name, command in commands.items():
            super().add_parser(name, help=command.help)
            self._unloaded[name] = command.module

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """Called by a module's `register`: replaces the placeholder of `name`."""
        if self._loading is None or self._unloaded.get(name) != self._loading:
            raise ValueError(f"streamctl {name}: not a command of {self._loading} in COMMANDS")
        if "help" in kwargs or "aliases" in kwargs:
            raise ValueError(f"streamctl {name}: its help is in stream.cli.commands.COMMANDS")
        del self._name_parser_map[name]
        return super().add_parser(name, **kwargs)

    def load(self, module: str) -> None:
        """Imports `stream.cli.<module>` and puts its commands' parsers in place."""
        names = [name for name, owner in self._unloaded.items() if owner == module]
        placeholders = {name: self._name_parser_map[name] for name in names}
        self._loading = module
        try:
            importlib.import_module(f"stream.cli.{module}").register(self)
        finally:
            self._loading = None
        for name in names:
            parser = self._name_parser_map[name]
            if parser is placeholders[name]:
                raise ValueError(f"stream.cli.{module} did not register `streamctl {name}`")
            del self._unloaded[name]
            self.prepare(parser)

    def load_all(self) -> None:
        """Loads every command's module (for tests that look at every parser)."""
        for module in dict.fromkeys(self._unloaded.values()):
            self.load(module)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if values:
            module = self._unloaded.get(values[0])
            if module is not None:
                self.load(module)
        super().__call__(parser, namespace, values, option_string)
