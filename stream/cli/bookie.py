"""`streamctl bookie ...`: run a bookie in the foreground, repair its cookie after a disk was
wiped or replaced, and ask a running one what it holds."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from rich.console import Console
from rich.table import Table

from stream.bookie.unsafe import UNSAFE_SKIP_OPTION
from stream.cli.connect import open_session, tls_config
from stream.cli.output import console as output_console
from stream.cli.output import (
    print_json,
    print_json_lines,
    runs_until_stopped,
    supports_json,
    wants_json,
)
from stream.errors import InvalidArgumentError, StreamError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds `bookie start|fix-cookie|info|state|decommission` and `bookies` to `streamctl`."""
    bookie = subparsers.add_parser("bookie")
    sub = bookie.add_subparsers(dest="bookie_command", metavar="SUBCOMMAND", required=True)

    start = sub.add_parser("start", help="run one bookie in the foreground")
    start.add_argument("--config", required=True, help="path of bookie.toml")
    # Test-only protections off (stream.bookie.unsafe): hidden from --help, on no other path.
    start.add_argument(UNSAFE_SKIP_OPTION, dest="unsafe_skip", default="", help=argparse.SUPPRESS)
    runs_until_stopped(start)
    start.set_defaults(handler=_start)

    fix = sub.add_parser(
        "fix-cookie",
        help="after a cookie mismatch (wiped or replaced disk, moved address or directories): "
        "protect every open stream (BP-46 phase one) and rewrite the cookie; run it with the "
        "bookie stopped",
    )
    fix.add_argument("--config", required=True, help="path of bookie.toml")
    fix.set_defaults(handler=_fix_cookie)

    info = sub.add_parser("info", help="print a running bookie's Info")
    info.add_argument("--address", required=True, help="the bookie's HOST:PORT")
    info.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    supports_json(info)
    info.set_defaults(handler=_info)

    state = sub.add_parser("state", help="print a running bookie's state of one stream")
    state.add_argument("--address", required=True, help="the bookie's HOST:PORT")
    state.add_argument("--stream-id", type=int, required=True, help="the stream's numeric id")
    state.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    supports_json(state)
    state.set_defaults(handler=_state)

    from stream.cli.autorecovery import add_decommission

    add_decommission(sub)

    bookies = subparsers.add_parser(
        "bookies",
        description="One row per bookie that joined the cluster. State: available, read-only, "
        "draining (being decommissioned) or down (holds a cookie, not registered now).",
    )
    supports_json(bookies)
    bookies.set_defaults(handler=_bookies)


def _start(args: argparse.Namespace) -> int:
    # Loaded here: the other subcommands must not pay for the storage engine's imports.
    from stream.bookie.config import BookieConfig
    from stream.bookie.process import run_bookie
    from stream.bookie.unsafe import parse_unsafe_skips

    return run_bookie(
        BookieConfig.load(args.config),
        log_json=args.log_json or None,
        unsafe=parse_unsafe_skips(args.unsafe_skip),
    )


def _fix_cookie(args: argparse.Namespace) -> int:
    from stream.bookie.config import BookieConfig
    from stream.bookie.cookie import CookieAction
    from stream.bookie.integrity import fix_cookie

    config = BookieConfig.load(args.config)
    report = fix_cookie(config)
    console = Console(soft_wrap=True)  # whole lines: operators grep them
    if report.action is not CookieAction.FIX:
        console.print(
            f"bookie {config.bookie_id}: nothing to fix (cookies {report.action.value}); "
            "start the bookie as usual"
        )
        return 0
    for problem in report.problems:
        console.print(f"fixed: {problem}", markup=False)
    if report.lost_directories:
        console.print(
            f"lost directories {', '.join(report.lost_directories)}: the index was discarded, "
            "the bookie rebuilds its entries from its peers"
        )
    console.print(
        f"bookie {config.bookie_id}: {report.limbo_streams} open streams term-fenced and put in "
        "limbo, cookie rewritten. Start the bookie: it repairs those streams in the background "
        "(phase two) and clears their limbo as each is repaired."
    )
    return 0


def _call(args: argparse.Namespace, method: str, request: object) -> object:
    """Makes one request to the bookie at `--address` (over TLS with the TLS options)."""
    import grpc

    from stream.security.tls import sync_channel
    from stream.wire import bookie_pb2_grpc

    address = args.address
    with sync_channel(address, tls_config(args)) as channel:
        stub = bookie_pb2_grpc.BookieStub(channel)
        try:
            return getattr(stub, method)(request, timeout=args.timeout)
        except grpc.RpcError as e:
            raise StreamError(
                f"{method} failed: {e.code().name}: {e.details()}", bookie=address
            ) from None


def _fields(message: Any) -> dict[str, Any]:
    """Returns a response's scalar fields by name: numbers stay numbers (protobuf's JSON
    mapping would turn 64-bit ones into strings) and enums become their names."""
    fields: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.enum_type is not None:
            value = field.enum_type.values_by_number[value].name
        fields[field.name] = value
    return fields


def _print_fields(args: argparse.Namespace, title: str, message: object) -> None:
    from stream.retention.units import format_size

    fields = _fields(message)
    if wants_json(args):
        print_json(fields)
        return
    table = Table(title=title, show_header=False)
    for key, value in fields.items():
        shown = format_size(value) if key.endswith("_bytes") and value else str(value)
        table.add_row(key, shown)
    output_console().print(table)


def _info(args: argparse.Namespace) -> int:
    from stream.wire import bookie_pb2 as pb

    _print_fields(
        args,
        f"bookie {args.address}",
        _call(args, "Info", pb.InfoRequest()),
    )
    return 0


def _state(args: argparse.Namespace) -> int:
    from stream.wire import bookie_pb2 as pb

    if args.stream_id <= 0:
        raise InvalidArgumentError("--stream-id must be >= 1", stream_id=args.stream_id)
    response = _call(args, "StreamState", pb.StreamStateRequest(stream_id=args.stream_id))
    _print_fields(args, f"stream {args.stream_id} on {args.address}", response)
    return 0


def _bookie_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Returns one dict per bookie that joined: its id, state, whether it drains, and its
    registration's fields (None for a bookie that is down)."""
    from stream.metadata import BookieRegistration, BookieRegistry
    from stream.metadata.underreplication import UnderreplicationStore

    with open_session(args) as session:
        registry = BookieRegistry(session)
        available = registry.available()
        known = set(registry.with_cookie()) | set(available)
        draining = UnderreplicationStore(session).draining()
    rows = []
    for bookie_id in sorted(known):
        reg = available.get(bookie_id)
        if reg is None:
            state = "down"
            fields = {f.name: None for f in dataclasses.fields(BookieRegistration)}
        else:
            state = "read-only" if reg.read_only else "available"
            fields = dataclasses.asdict(reg)
        if bookie_id in draining and reg is not None:
            state = "draining"  # it turned read-only for that: say why
        address = fields.pop("address")
        rows.append(
            {
                "bookie_id": bookie_id,
                "address": address,
                "state": state,
                "draining": bookie_id in draining,
                **fields,
            }
        )
    return rows


# Columns of `streamctl bookies` named apart from the registration's own field names.
_BOOKIE_COLUMNS = {"bookie_id": "bookie", "journal_write_data": "journal", "free_bytes": "free"}


def _shown(key: str, value: Any) -> str:
    from stream.retention.units import format_size

    if value is None:
        return "-"
    if key == "journal_write_data":
        return "on" if value else "off (BP-46)"
    if key.endswith("_bytes") and isinstance(value, int):
        return format_size(value)
    return str(value)


def _bookies(args: argparse.Namespace) -> int:
    rows = _bookie_rows(args)
    if wants_json(args):
        print_json_lines(rows)
        return 0
    # Every field a registration holds gets a column, also ones added after this was written.
    keys = [k for k in (rows[0] if rows else {}) if k not in ("draining", "read_only")]
    table = Table(title=f"bookies: {len(rows)}")
    for key in keys:
        table.add_column(_BOOKIE_COLUMNS.get(key, key.replace("_", " ")))
    for row in rows:
        cells = [_shown(key, row[key]) for key in keys]
        if row["draining"] and row["state"] != "draining":
            cells[keys.index("state")] += ", draining"
        table.add_row(*cells)
    output_console().print(table)
    return 0
