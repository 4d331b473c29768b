"""`streamctl`: one command for operators and users. Each area registers its subcommands from
its own module (`register(subparsers)`); a handler gets the parsed args and returns an exit code."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from stream.errors import StreamError
from stream.logging import configure_logging

DEFAULT_METADATA = "127.0.0.1:2181/streamkeeper"

# Modules under stream.cli that add subcommands, in help order.
COMMAND_MODULES = ("bookie", "sandbox", "streams", "retention", "autorecovery", "bench", "sim")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamctl", description="Streamkeeper: replicated, durable streams"
    )
    parser.add_argument(
        "--metadata",
        default=DEFAULT_METADATA,
        help=f"ZooKeeper HOSTS/ROOT (default {DEFAULT_METADATA})",
    )
    parser.add_argument("--log-level", default="warning", help="debug|info|warning|error")
    parser.add_argument(
        "--log-json",
        action="store_true",
        help="log JSON lines (default: readable on a terminal, JSON otherwise)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"stream.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(json=True if args.log_json else None, level=args.log_level)
    try:
        return int(args.handler(args) or 0)
    except StreamError as e:
        sys.stderr.write(f"streamctl: error: {e}\n")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
