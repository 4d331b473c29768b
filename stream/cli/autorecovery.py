"""`streamctl autorecovery run`, `streamctl underreplicated` and `streamctl bookie
decommission` (docs/design.md §7, §9)."""

from __future__ import annotations

import argparse
import signal
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stream.cli.connect import open_session, tls_config
from stream.cli.output import console as output_console
from stream.cli.output import print_json, runs_until_stopped, supports_json, wants_json
from stream.errors import StreamError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds `autorecovery run` and `underreplicated` (`bookie decommission` is added by
    `stream.cli.bookie` with `add_decommission`)."""
    autorecovery = subparsers.add_parser("autorecovery")
    sub = autorecovery.add_subparsers(dest="autorecovery_command", metavar="ACTION", required=True)
    run = sub.add_parser(
        "run",
        help="run an auditor candidate and replication workers until SIGTERM/Ctrl-C",
        description="Contends for /auditor/leader (the leader marks the fragments of lost "
        "or draining bookies and scrubs); its workers copy marked fragments to other bookies. "
        "Bookies run the same in-process unless `autorecovery = false`.",
    )
    run.add_argument(
        "--lost-bookie-recovery-delay",
        default="30s",
        help="a bookie missing this long is lost (default 30s)",
    )
    run.add_argument(
        "--open-stream-replication-delay",
        default="30s",
        help="grace before an idle stream's open fragment is closed by a takeover (30s)",
    )
    run.add_argument("--audit-interval", default="10m", help="full audit period (10m)")
    run.add_argument("--scrub-interval", default="1h", help="first/last-entry scrub (1h)")
    run.add_argument(
        "--full-scrub-interval", default="1d", help="checksum scrub of every entry (1d; 0: never)"
    )
    run.add_argument("--workers", type=int, default=1, help="replication workers (default 1)")
    run.add_argument("--no-auditor", action="store_true", help="workers only")
    run.add_argument(
        "--rate-limit", default="0", help="copy bytes per second per worker (0: unlimited)"
    )
    run.add_argument("--session-timeout", default="10s", help="ZooKeeper session timeout")
    run.add_argument("--id", default=None, help="name of this instance (default host-pid)")
    runs_until_stopped(run)
    run.set_defaults(handler=_run)

    under = subparsers.add_parser("underreplicated")
    supports_json(under)
    under.set_defaults(handler=_underreplicated)


def add_decommission(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    decommission = sub.add_parser(
        "decommission",
        help="drain a bookie: every fragment naming it is copied elsewhere",
        description="Marks the bookie draining (it turns read-only, so writers move off it; "
        "the auditor marks its fragments and workers copy them), then waits until no "
        "fragment names it. The bookie can then be stopped and its disks reused.",
    )
    decommission.add_argument("bookie_id")
    decommission.add_argument("--timeout", default="1h", help="give up waiting after (1h)")
    decommission.add_argument("--no-wait", action="store_true", help="start the drain only")
    decommission.add_argument("--cancel", action="store_true", help="stop draining the bookie")
    decommission.set_defaults(handler=_decommission)


def _ms(text: str) -> int:
    from stream.retention.units import parse_duration

    return int(round(parse_duration(text) * 1000)) if text.strip() not in ("0", "0s") else 0


def _run(args: argparse.Namespace) -> int:
    from stream.autorecovery import AutoRecoverySettings
    from stream.autorecovery.service import AutoRecovery
    from stream.logs import configure_logging
    from stream.retention.units import parse_duration, parse_size

    settings = AutoRecoverySettings(
        lost_bookie_recovery_delay_ms=_ms(args.lost_bookie_recovery_delay),
        open_stream_replication_delay_ms=_ms(args.open_stream_replication_delay),
        audit_interval_ms=_ms(args.audit_interval),
        scrub_interval_ms=_ms(args.scrub_interval),
        scrub_full_interval_ms=_ms(args.full_scrub_interval),
        replication_workers=args.workers,
        replication_rate_bytes=0 if args.rate_limit.strip() == "0" else parse_size(args.rate_limit),
    )
    configure_logging(
        json=args.log_json or None, level="debug" if args.log_level == "debug" else "info"
    )
    with open_session(args, parse_duration(args.session_timeout)) as session:
        service = AutoRecovery(
            session,
            settings,
            identifier=args.id,
            auditor=not args.no_auditor,
            tls=tls_config(args),
        )

        def on_signal(*_: object) -> None:
            service.stop(timeout_s=0)

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, on_signal)
        service.run()
    return 0


def _underreplicated(args: argparse.Namespace) -> int:
    from stream.metadata import StreamStore
    from stream.metadata.underreplication import UnderreplicationStore

    with open_session(args) as session:
        store = UnderreplicationStore(session)
        streams = StreamStore(session)
        now_ms = time.time_ns() // 1_000_000
        names: dict[int, str] = {}
        rows: list[dict[str, Any]] = []
        for marker in store.markers():
            if marker.stream_id not in names:
                try:
                    names[marker.stream_id] = streams.get_stream_by_id(marker.stream_id)[0].name
                except StreamError:
                    names[marker.stream_id] = f"#{marker.stream_id} (gone)"
            lock = store.lock_info(marker.name)
            rows.append(
                {
                    "stream": names[marker.stream_id],
                    "stream_id": marker.stream_id,
                    "first_entry_id": marker.first_entry_id,
                    "replace": list(marker.bookies),
                    "reason": marker.reason,
                    "age_s": max(0, now_ms - marker.marked_ms) // 1000,
                    "worker": lock.owner if lock else None,
                    "copied_entries": lock.copied_entries if lock and lock.target else None,
                    "target": lock.target if lock and lock.target else None,
                }
            )
        draining = sorted(store.draining())
    if wants_json(args):
        print_json({"fragments": rows, "draining": draining})
        return 0
    console = output_console()
    console.print(_underreplicated_table(rows))
    if draining:
        console.print(f"draining: {', '.join(draining)}")
    return 0


def _underreplicated_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title=f"under-replicated fragments: {len(rows)}")
    for column in ("stream", "first entry", "replace", "reason", "age", "worker", "copied"):
        table.add_column(column, justify="right" if column in ("first entry", "copied") else "left")
    for row in rows:
        table.add_row(
            row["stream"],
            str(row["first_entry_id"]),
            ", ".join(row["replace"]),
            row["reason"],
            f"{row['age_s']}s",
            row["worker"] or "-",
            "-" if row["target"] is None else f"{row['copied_entries']} entries -> {row['target']}",
        )
    return table


def fragments_naming(session: Any, bookie_id: str) -> int:
    """Returns how many fragments (of every stream, sealed ones too) name `bookie_id`."""
    from stream.errors import StreamNotFoundError
    from stream.metadata import StreamStore

    store = StreamStore(session)
    count = 0
    for stream_id in store.stream_ids():
        try:
            _, _, fragments = store.get_snapshot(stream_id)
        except StreamNotFoundError:
            continue
        count += sum(1 for f in fragments if bookie_id in f.ensemble)
    return count


def _decommission(args: argparse.Namespace) -> int:
    from stream.errors import BookieNotFoundError
    from stream.metadata import BookieRegistry, validate_bookie_id
    from stream.metadata.underreplication import UnderreplicationStore
    from stream.retention.units import parse_duration

    bookie_id = validate_bookie_id(args.bookie_id)
    timeout_s = parse_duration(args.timeout)
    console = Console(stderr=True)
    with open_session(args) as session:
        store = UnderreplicationStore(session)
        if args.cancel:
            store.set_draining(bookie_id, False)
            console.print(f"{bookie_id} is no longer draining")
            return 0
        registry = BookieRegistry(session)
        if registry.read_cookie(bookie_id) is None and bookie_id not in registry.available():
            raise BookieNotFoundError("unknown bookie: it never registered", bookie=bookie_id)
        store.set_draining(bookie_id, True)
        total = fragments_naming(session, bookie_id)
        console.print(f"draining {bookie_id}: {total} fragments name it")
        if args.no_wait:
            return 0
        deadline = time.monotonic() + timeout_s
        left = total
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} fragments moved"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            task = progress.add_task(f"draining {bookie_id}", total=max(total, 1))
            while left > 0:
                if time.monotonic() > deadline:
                    console.print(f"timed out: {left} fragments still name {bookie_id}")
                    return 1
                time.sleep(1.0)
                left = fragments_naming(session, bookie_id)
                total = max(total, left)
                progress.update(task, total=max(total, 1), completed=total - left)
    console.print(f"{bookie_id} holds no fragment any more: stop it and reuse its disks")
    return 0
