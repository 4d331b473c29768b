"""`streamctl`: one command for operators and users. Each area registers its subcommands from
its own module (`register(subparsers)`), imported only when one of its commands runs
(`stream.cli.commands`); a handler gets the parsed args and returns an exit code
(`stream.cli.exit_codes`)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from collections.abc import Iterator, Sequence

from stream.cli import arguments
from stream.cli.commands import COMMANDS, LazyCommands
from stream.cli.exit_codes import ExitCode, exit_code_for
from stream.errors import StreamError
from stream.logs import configure_logging

DEFAULT_METADATA = "127.0.0.1:2181/streamkeeper"
METADATA_ENV = "STREAMKEEPER_METADATA"
METADATA_AUTH_ENV = "STREAMKEEPER_METADATA_AUTH_FILE"
# Unreachable metadata is reported within 3 s of starting: imports and the connect attempt.
DEFAULT_CONNECT_TIMEOUT_S = 1.5

# Options whose values may start with a dash (a time before now: `--from-time -1h`).
DASH_VALUE_OPTIONS = ("--from-time", "--to-time")


def _add_global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Adds the options every command takes. Below the top parser they default to SUPPRESS, so
    that given after the subcommand they override the top's value, and otherwise leave it."""

    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    metadata = os.environ.get(METADATA_ENV) or DEFAULT_METADATA
    parser.add_argument(
        "--metadata",
        default=default(metadata),
        help=f"ZooKeeper HOSTS/ROOT (default ${METADATA_ENV}, else {DEFAULT_METADATA})",
    )
    parser.add_argument(
        "--metadata-auth-file",
        default=default(os.environ.get(METADATA_AUTH_ENV) or None),
        metavar="FILE",
        help=f"ZooKeeper identity to use (mode 0600 TOML; default ${METADATA_AUTH_ENV})",
    )
    parser.add_argument(
        "--connect-timeout",
        type=arguments.duration,
        default=default(DEFAULT_CONNECT_TIMEOUT_S),
        metavar="SECONDS",
        help=f"give up reaching the metadata after (default {DEFAULT_CONNECT_TIMEOUT_S:g}; 500ms)",
    )
    for flag, what in (
        ("--tls-ca", "CA certificate that signed the bookies' (turns TLS on)"),
        ("--tls-cert", "this client's certificate (with --tls-ca)"),
        ("--tls-key", "this client's key, mode 0600 (with --tls-ca)"),
    ):
        env = "STREAMKEEPER_" + flag[2:].upper().replace("-", "_") + "_FILE"
        parser.add_argument(
            flag,
            default=default(os.environ.get(env)),
            metavar="FILE",
            help=f"{what}; default ${env}",
        )
    if "--output" not in parser._option_string_actions:
        parser.add_argument(
            "--output",
            choices=("text", "json"),
            default=default("text"),
            help="text (tables) or json (for scripts)",
        )


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Yields every parser below `parser`, each once (aliases share one)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for child in action.choices.values():
                if id(child) not in seen:
                    seen.add(id(child))
                    yield child
                    yield from _subparsers(child)


def build_parser(*, load_all: bool = False) -> argparse.ArgumentParser:
    """Returns `streamctl`'s parser; a command's module is imported when the command is parsed,
    or here with `load_all` (tests that look at every parser)."""
    parser = argparse.ArgumentParser(
        prog="streamctl",
        description="Streamkeeper: replicated, durable streams. Exit codes: 0 ok, 1 error, "
        "2 usage, 3 not found, 4 unavailable, 5 conflict, 6 denied.",
    )
    _add_global_options(parser, top=True)
    parser.add_argument("--log-level", default="warning", help="debug|info|warning|error")
    parser.add_argument(
        "--log-json",
        action="store_true",
        help="log JSON lines (default: readable on a terminal, JSON otherwise)",
    )
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, action=LazyCommands
    )
    assert isinstance(sub, LazyCommands)
    sub.prepare = _add_global_options_below
    sub.add_commands(COMMANDS)
    if load_all:
        sub.load_all()
    return parser


def _add_global_options_below(command: argparse.ArgumentParser) -> None:
    """Gives a command's parser, and every parser below it, the global options."""
    for parser in (command, *_subparsers(command)):
        _add_global_options(parser, top=False)


def _quiet_kazoo(args: argparse.Namespace) -> None:
    """Keeps kazoo's own lines ("Connection dropped: ...", one per retry) off stderr: a command
    reports its outcome in one line. Services (`runs_until_stopped`) and `--log-level debug`
    keep them."""
    if not getattr(args, "service", False) and args.log_level.lower() != "debug":
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    from_process_args = argv is None
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(arguments.join_dash_values(argv, DASH_VALUE_OPTIONS))
    if args.output == "json" and not getattr(args, "json_output", False):
        parser.error(f"{args.command}: --output json is not supported here")
    configure_logging(json=True if args.log_json else None, level=args.log_level)
    _quiet_kazoo(args)
    if from_process_args:
        # What start-up imported lives as long as the process: frozen, it is out of the
        # cyclic collector's walk, so a full collection looks only at what the command
        # allocates. On a busy bookie or writer those walks took 30-270 ms every few seconds,
        # each a stall of the event loop (docs/benchmarks.md). Not for in-process callers
        # (tests), whose later garbage must stay collectable.
        gc.freeze()
    try:
        return int(args.handler(args) or 0)
    except StreamError as e:
        sys.stderr.write(f"streamctl: error: {e}\n")
        return int(exit_code_for(e))
    except TimeoutError as e:
        sys.stderr.write(f"streamctl: error: timed out: {e}\n")
        return int(ExitCode.UNAVAILABLE)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
