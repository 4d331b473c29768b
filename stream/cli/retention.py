"""`streamctl retention set|show|run`: a stream's retention policy in human units, and the
retention service in the foreground."""

from __future__ import annotations

import argparse
import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table

from stream.cli.connect import open_session, tls_config
from stream.cli.output import console as output_console
from stream.cli.output import print_json, runs_until_stopped, supports_json, wants_json
from stream.errors import InvalidArgumentError

_NONE = ("none", "off", "unlimited")
T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds `retention set|show|run` to `streamctl`."""
    retention = subparsers.add_parser("retention")
    sub = retention.add_subparsers(dest="retention_command", metavar="ACTION", required=True)

    set_cmd = sub.add_parser(
        "set",
        help="set a stream's retention policy",
        description="Sets the limits given and keeps the others; 'none' removes one limit.",
    )
    set_cmd.add_argument("name")
    set_cmd.add_argument("--max-age", help="e.g. 7d, 12h, 90m, 30s, or none")
    set_cmd.add_argument("--max-bytes", help="e.g. 10GiB, 500MB, 4096, or none")
    set_cmd.add_argument(
        "--keep-unconsumed",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the age limit spares fragments a durable cursor has not consumed; --max-bytes "
        "still bounds them",
    )
    set_cmd.add_argument("--clear", action="store_true", help="keep everything (no policy)")
    set_cmd.set_defaults(handler=_set)

    show = sub.add_parser("show", help="show a stream's policy and what it retains")
    show.add_argument("name")
    supports_json(show)
    show.set_defaults(handler=_show)

    run = sub.add_parser(
        "run",
        help="run the retention service (leader-elected) until SIGTERM/Ctrl-C",
        description="Contends for leadership under /retention; the leader applies every "
        "stream's policy each interval. Run several for availability.",
    )
    run.add_argument("--interval", default="60s", help="time between rounds (default 60s)")
    run.add_argument("--once", action="store_true", help="one round now, without the election")
    run.add_argument("--max-streams-per-round", type=int, default=1000)
    run.add_argument("--max-fragments-per-round", type=int, default=10_000)
    run.add_argument("--max-takeovers-per-round", type=int, default=4)
    run.add_argument("--session-timeout", default="10s", help="ZooKeeper session timeout")
    run.add_argument("--id", default=None, help="name of this instance (default host-pid)")
    run.add_argument(
        "--metrics-listen",
        default="",
        help="serve Prometheus metrics (each cursor's lag) on HOST:PORT (default: off)",
    )
    runs_until_stopped(run)
    run.set_defaults(handler=_run)


def _optional(text: str | None, parse: Callable[[str], T]) -> tuple[bool, T | None]:
    """Returns (given, value) of an optional limit: value None for 'none'."""
    if text is None:
        return False, None
    if text.strip().lower() in _NONE:
        return True, None
    return True, parse(text)


def _set(args: argparse.Namespace) -> int:
    from stream.metadata import RetentionPolicy, StreamStore
    from stream.retention.units import parse_duration, parse_size

    limits = (args.max_age, args.max_bytes, args.keep_unconsumed)
    if not args.clear and all(value is None for value in limits):
        raise InvalidArgumentError("give --max-age, --max-bytes, --keep-unconsumed or --clear")
    if args.clear and any(value is not None for value in limits):
        raise InvalidArgumentError("--clear goes alone")
    # Everything is parsed before anything is written.
    age_given, max_age_s = _optional(args.max_age, parse_duration)
    bytes_given, max_bytes = _optional(args.max_bytes, parse_size)
    with open_session(args) as session:
        store = StreamStore(session)
        meta, _ = store.get_stream(args.name)
        current = meta.retention or RetentionPolicy()
        policy: RetentionPolicy | None = None
        if not args.clear:
            policy = RetentionPolicy(
                max_age_s=max_age_s if age_given else current.max_age_s,
                max_bytes=max_bytes if bytes_given else current.max_bytes,
                keep_unconsumed=current.keep_unconsumed
                if args.keep_unconsumed is None
                else args.keep_unconsumed,
            )
            if policy.max_age_s is None and policy.max_bytes is None:
                policy = None
        meta, _ = store.set_retention(meta.id, policy)
    Console().print(f"retention of [bold]{meta.name}[/]: {_describe(meta.retention)}")
    return 0


def _describe(policy: Any) -> str:
    from stream.retention.units import format_duration, format_size

    if policy is None or (policy.max_age_s is None and policy.max_bytes is None):
        return "keep everything"
    parts = []
    if policy.max_age_s is not None:
        parts.append(f"max age {format_duration(policy.max_age_s)}")
    if policy.max_bytes is not None:
        parts.append(f"max bytes {format_size(policy.max_bytes)}")
    if policy.keep_unconsumed:
        parts.append("keeping what cursors have not consumed")
    return ", ".join(parts)


def _show(args: argparse.Namespace) -> int:
    from stream.metadata import CursorStore, StreamStore
    from stream.retention.policy import held_back, plan_retention

    with open_session(args) as session:
        store = StreamStore(session)
        meta, _ = store.get_stream(args.name)
        meta, _, fragments = store.get_snapshot(meta.id)
        writer_alive = store.writer_alive(meta.id)
        cursors = {n: p.entry_id for n, p in CursorStore(session).list(meta.id).items()}
    now_ms = int(time.time() * 1000)
    policy = meta.retention
    plan = plan_retention(fragments, policy, now_ms, cursors.values())
    closed = fragments[:-1]
    known = [f.bytes for f in closed if f.bytes is not None]
    stamps = [f.last_timestamp_ms for f in closed if f.last_timestamp_ms is not None]
    report: dict[str, Any] = {
        "stream": meta.name,
        "max_age_s": None if policy is None else policy.max_age_s,
        "max_bytes": None if policy is None else policy.max_bytes,
        "first_entry_id": meta.first_entry_id,
        "fragments_retained": len(fragments),
        "closed_fragments_bytes": sum(known),
        "closed_fragments_of_unknown_size": len(closed) - len(known),
        # Whole seconds: "3d4h5m6s ago" reads better than a float.
        "oldest_closed_age_s": max(round((now_ms - min(stamps)) / 1000), 1) if stamps else None,
        "fragments_due_for_deletion": plan.delete_count,
        "writer_alive": writer_alive,
        "keep_unconsumed": policy is not None and policy.keep_unconsumed,
        "fragments_held_by_cursors": plan.held_by_cursors,
        # Per cursor: its position and what the age limit would drop that it has not consumed.
        "cursors": {
            name: {"position": cursors[name], "held_fragments": count, "held_bytes": size}
            for name, (count, size) in held_back(fragments, policy, now_ms, cursors).items()
        },
    }
    if wants_json(args):
        print_json(report)
    else:
        output_console().print(_retention_table(report, policy))
    return 0


def _retention_table(report: dict[str, Any], policy: Any) -> Table:
    from stream.retention.units import format_duration, format_size

    def shown(value: Any, fmt: Callable[[Any], str]) -> str:
        return "-" if value is None else fmt(value)

    table = Table(title=f"retention of {report['stream']}", show_header=False)
    table.add_row("policy", _describe(policy))
    table.add_row("max age", shown(report["max_age_s"], format_duration))
    table.add_row("max bytes", shown(report["max_bytes"], format_size))
    table.add_row("first retained entry", str(report["first_entry_id"]))
    table.add_row("fragments retained", str(report["fragments_retained"]))
    shown_bytes = format_size(report["closed_fragments_bytes"])
    if report["closed_fragments_of_unknown_size"]:
        shown_bytes += f" (+{report['closed_fragments_of_unknown_size']} fragments of unknown size)"
    table.add_row("closed fragments' bytes", shown_bytes + " (+ the open last fragment)")
    if report["oldest_closed_age_s"] is not None:
        table.add_row(
            "oldest closed fragment's last entry",
            format_duration(report["oldest_closed_age_s"]) + " ago",
        )
    table.add_row("due for deletion", f"{report['fragments_due_for_deletion']} fragments")
    table.add_row("writer", "live" if report["writer_alive"] else "none")
    if report["keep_unconsumed"]:
        table.add_row("held back by cursors", f"{report['fragments_held_by_cursors']} fragments")
        for name, held in sorted(report["cursors"].items()):
            table.add_row(
                f"  cursor {name} (at {held['position']})",
                f"holds {held['held_fragments']} fragments, {format_size(held['held_bytes'])}",
            )
    return table


@contextlib.contextmanager
def _shut_down(server: Any) -> Iterator[None]:
    """Stops the metrics endpoint `server` (None: there is none) on the way out."""
    try:
        yield
    finally:
        if server is not None:
            server.shutdown()


def _run(args: argparse.Namespace) -> int:
    from stream.logs import configure_logging
    from stream.retention.service import RetentionService, RetentionSettings
    from stream.retention.units import parse_duration

    settings = RetentionSettings(
        interval_s=parse_duration(args.interval),
        max_streams_per_round=args.max_streams_per_round,
        max_fragments_per_round=args.max_fragments_per_round,
        max_takeovers_per_round=args.max_takeovers_per_round,
        export_cursor_lag=bool(args.metrics_listen),
    )
    session_timeout_s = parse_duration(args.session_timeout)
    # A service logs what it does, at info unless asked for more.
    configure_logging(
        json=args.log_json or None, level="debug" if args.log_level == "debug" else "info"
    )
    console = Console(stderr=True)
    server: Any = None
    if args.metrics_listen:
        from stream.retention.metrics import serve_metrics

        server = serve_metrics(args.metrics_listen)
    with open_session(args, session_timeout_s) as session, _shut_down(server):
        service = RetentionService(session, settings, identifier=args.id, tls=tls_config(args))
        if args.once:
            try:
                report = service.run_once()
            finally:
                service.close()
            console.print(
                f"deleted {report.fragments_deleted} fragments of {report.streams_checked} "
                f"streams; {report.idle_takeovers} idle takeovers; {report.errors} errors"
            )
            return 0 if report.errors == 0 else 1

        def on_signal(*_: object) -> None:
            service.stop()

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, on_signal)
        service.run()
    return 0
