"""`streamctl cursors list|show|reset|delete STREAM`: consumers' durable cursors, their lag, and
moving or dropping them."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
from typing import Any

from rich.table import Table

from stream.cli.arguments import start_position, time_ms
from stream.cli.connect import open_client
from stream.cli.output import console as output_console
from stream.cli.output import print_json, supports_json, wants_json
from stream.errors import CursorNotFoundError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds `cursors list|show|reset|delete` to `streamctl`."""
    cursors = subparsers.add_parser("cursors")
    sub = cursors.add_subparsers(dest="cursors_command", metavar="ACTION", required=True)

    listing = sub.add_parser("list", help="every cursor of a stream with its lag")
    listing.add_argument("stream")
    supports_json(listing)
    listing.set_defaults(handler=_list)

    show = sub.add_parser("show", help="one cursor's position and lag")
    show.add_argument("stream")
    show.add_argument("cursor")
    supports_json(show)
    show.set_defaults(handler=_show)

    reset = sub.add_parser(
        "reset",
        help="move a cursor so that its consumer reads TO next",
        description="Moves the cursor backwards or forwards (creating it when absent) so that "
        "its consumer reads TO next: earliest (the first retained entry), latest (the entry "
        "after the LAC), an entry id, or with --to-time the first entry stamped at or after a "
        "time. A consumer running meanwhile commits over it: stop it first.",
    )
    reset.add_argument("stream")
    reset.add_argument("cursor")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to", type=start_position, help="earliest|latest|ID")
    to.add_argument(
        "--to-time",
        dest="to_time_ms",
        type=time_ms,
        metavar="TIME",
        help="the first entry stamped at or after TIME: 2026-11-24T10:00Z or -1h",
    )
    supports_json(reset)
    reset.set_defaults(handler=_reset)

    delete = sub.add_parser("delete", help="delete a cursor")
    delete.add_argument("stream")
    delete.add_argument("cursor")
    delete.set_defaults(handler=_delete)


def cursor_row(name: str, lag: Any) -> dict[str, Any]:
    """Returns a cursor's `CursorLag` as a row (also the JSON form)."""
    return {"cursor": name, **dataclasses.asdict(lag)}


def _committed_at(committed_ms: int | None) -> str:
    if committed_ms is None:
        return "-"
    at = datetime.datetime.fromtimestamp(committed_ms / 1000, datetime.UTC)
    return at.isoformat(timespec="seconds")


def cursor_table(rows: list[dict[str, Any]], title: str) -> Table:
    """Returns the table of cursors (the `cursor_row` form) that `list` and `info` print."""
    from stream.retention.units import format_size

    table = Table(title=title)
    for column in ("cursor", "position", "committed (UTC)", "lag entries", "lag bytes"):
        table.add_column(column)
    for row in rows:
        lag_bytes = row["bytes"]
        table.add_row(
            row["cursor"],
            str(row["position"]),
            _committed_at(row["committed_ms"]),
            str(row["entries"]),
            "?" if lag_bytes is None else format_size(lag_bytes),
        )
    return table


def _list(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        rows = [cursor_row(name, lag) for name, lag in client.cursors(args.stream).items()]
    if wants_json(args):
        print_json(rows)
    else:
        output_console().print(cursor_table(rows, f"cursors of {args.stream}"))
    return 0


def _show(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        cursor = client.cursor(args.stream, args.cursor)
        lag = client.cursors(args.stream).get(cursor.name)
    if lag is None:
        raise CursorNotFoundError("no such cursor", stream=args.stream, cursor=args.cursor)
    row = cursor_row(args.cursor, lag)
    if wants_json(args):
        print_json(row)
    else:
        output_console().print(cursor_table([row], f"cursor {args.cursor} of {args.stream}"))
    return 0


def _reset(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        cursor = client.cursor(args.stream, args.cursor)
        if args.to_time_ms is not None:
            position = cursor.reset_time(args.to_time_ms)
        else:
            position = cursor.reset(args.to)
    if wants_json(args):
        print_json({"stream": args.stream, "cursor": args.cursor, "position": position})
    else:
        output_console().print(
            f"cursor {args.cursor} of {args.stream}: position {position} "
            f"(its consumer reads entry {position + 1} next)"
        )
    return 0


def _delete(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        client.cursor(args.stream, args.cursor).delete()
    output_console().print(f"deleted cursor {args.cursor} of {args.stream}")
    return 0
