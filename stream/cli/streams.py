"""`streamctl create|append|tail|info|trim|seal|recover|delete|streams`: the stream commands
over `StreamClient`."""

from __future__ import annotations

import argparse
import base64
import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime
import itertools
import json
import sys
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, cast

from rich.console import Console
from rich.progress import Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stream.cli.arguments import (
    duration,
    entry_id,
    header,
    positive_int,
    size,
    start_position,
    time_ms,
)
from stream.cli.connect import open_client
from stream.cli.exit_codes import ExitCode
from stream.cli.output import console as output_console
from stream.cli.output import print_json, print_json_lines, supports_json, wants_json
from stream.errors import StreamError

if TYPE_CHECKING:
    from stream.client import StreamWriter
    from stream.client.entry import Entry


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the stream commands to `streamctl`."""
    create = subparsers.add_parser("create")
    create.add_argument("name")
    create.add_argument("--ensemble", type=int, default=3, help="E (default 3)")
    create.add_argument("--write-quorum", type=int, default=3, help="WQ (default 3)")
    create.add_argument("--ack-quorum", type=int, default=2, help="AQ (default 2)")
    create.add_argument("--fragment-max-entries", type=int, default=100_000)
    create.add_argument("--fragment-max-bytes", type=size, default=64 << 20, help="e.g. 64MiB")
    create.add_argument("--fragment-max-age", type=duration, default=None, help="e.g. 1h, 90s")
    create.add_argument("--retention-max-age", type=duration, default=None, help="e.g. 7d, 12h")
    create.add_argument("--retention-max-bytes", type=size, default=None, help="e.g. 10GiB")
    create.add_argument(
        "--allow-fewer-bookies",
        action="store_true",
        help="create it even when fewer writable bookies than E are registered "
        "(appends wait for them)",
    )
    create.set_defaults(handler=_create)

    append = subparsers.add_parser("append")
    append.add_argument("name")
    append.add_argument("--message", "-m", action="append", help="an entry (repeatable)")
    append.add_argument("--key", default=None, help="the key of every entry appended (UTF-8)")
    append.add_argument(
        "--header",
        dest="headers",
        type=header,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a header of every entry appended (repeatable, in order)",
    )
    append.set_defaults(handler=_append)

    tail = subparsers.add_parser("tail")
    tail.add_argument("name")
    start = tail.add_mutually_exclusive_group()
    start.add_argument(
        "--from", dest="start", type=start_position, default="latest", help="earliest|latest|ID"
    )
    start.add_argument(
        "--from-time",
        dest="start_time_ms",
        type=time_ms,
        default=None,
        metavar="TIME",
        help="the first entry stamped at or after TIME: 2026-11-24T10:00Z (UTC without an "
        "offset) or before now: -1h, -90m, -7d",
    )
    tail.add_argument(
        "--timeout", type=float, default=None, help="stop after this many idle seconds"
    )
    tail.add_argument("--show-ids", action="store_true", help="prefix entry id and time")
    tail.add_argument(
        "--max-entries",
        type=positive_int,
        default=None,
        metavar="N",
        help="stop after printing N entries",
    )
    supports_json(tail)
    tail.set_defaults(handler=_tail)

    info = subparsers.add_parser("info")
    info.add_argument("name")
    supports_json(info)
    info.set_defaults(handler=_info)

    trim = subparsers.add_parser("trim")
    trim.add_argument("name")
    trim.add_argument("--before", type=entry_id, required=True, help="entry id")
    trim.set_defaults(handler=_trim)

    seal = subparsers.add_parser("seal")
    seal.add_argument("name")
    seal.set_defaults(handler=_seal)

    recover = subparsers.add_parser("recover")
    recover.add_argument("name")
    recover.add_argument(
        "--accept-loss",
        action="store_true",
        help="end the previous term after the last entry some bookie still holds",
    )
    recover.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    supports_json(recover)
    recover.set_defaults(handler=_recover)

    delete = subparsers.add_parser("delete")
    delete.add_argument("name")
    delete.add_argument(
        "--force", action="store_true", help="delete it even while a writer has it open"
    )
    delete.set_defaults(handler=_delete)

    streams = subparsers.add_parser("streams")
    supports_json(streams)
    streams.set_defaults(handler=_list)


def _client(args: argparse.Namespace) -> Any:
    return open_client(args)


def _create(args: argparse.Namespace) -> int:
    from stream.client import RetentionPolicy

    retention = None
    if args.retention_max_age is not None or args.retention_max_bytes is not None:
        retention = RetentionPolicy(
            max_age_s=args.retention_max_age, max_bytes=args.retention_max_bytes
        )
    with _client(args) as client:
        meta = client.create_stream(
            args.name,
            ensemble=args.ensemble,
            write_quorum=args.write_quorum,
            ack_quorum=args.ack_quorum,
            fragment_max_entries=args.fragment_max_entries,
            fragment_max_bytes=args.fragment_max_bytes,
            fragment_max_age_s=args.fragment_max_age,
            retention=retention,
            allow_fewer_bookies=args.allow_fewer_bookies,
        )
    Console().print(
        f"created stream [bold]{meta.name}[/] (id {meta.id}, "
        f"E={meta.ensemble} WQ={meta.write_quorum} AQ={meta.ack_quorum})"
    )
    return 0


def _stdin_lines() -> Iterator[bytes]:
    for line in sys.stdin.buffer:
        yield line.rstrip(b"\r\n")


def _append(args: argparse.Namespace) -> int:
    messages: Iterator[bytes] = (
        iter([m.encode() for m in args.message]) if args.message else _stdin_lines()
    )
    console = Console(stderr=True)
    done = _Acked()
    try:
        with (
            _client(args) as client,
            client.open_writer(args.name) as writer,
            _append_progress(console) as progress,
        ):
            key = None if args.key is None else args.key.encode()
            _append_all(writer, messages, done, progress, key, args.headers)
    except (KeyboardInterrupt, StreamError):
        # What got in is the one thing the user needs next (to resume, to check).
        console.print(f"stopped: {done.summary()}", soft_wrap=True)
        raise
    console.print(f"appended {done.summary()}" if done.count else "nothing to append")
    return 0


# Appends in flight at a time: stdin is read as the acknowledgements come back, so memory
# stays bounded however long the input is.
_APPEND_IN_FLIGHT = 8192


class _Acked:
    """What `streamctl append` got acknowledged so far."""

    def __init__(self) -> None:
        self.count = 0
        self.first: int | None = None
        self.last: int | None = None

    def add(self, entry_id: int) -> None:
        self.count += 1
        self.first = entry_id if self.first is None else self.first
        self.last = entry_id

    def summary(self) -> str:
        if not self.count:
            return "0 entries acknowledged"
        return f"{self.count} entries acknowledged: {self.first}..{self.last} (last id {self.last})"


def _append_all(
    writer: StreamWriter,
    messages: Iterator[bytes],
    done: _Acked,
    progress: Callable[[int], None],
    key: bytes | None = None,
    headers: list[tuple[str, bytes]] | None = None,
) -> None:
    pending: collections.deque[concurrent.futures.Future[int]] = collections.deque()
    try:
        for message in messages:
            pending.append(writer.append_async(message, key=key, headers=headers))
            while pending and (len(pending) >= _APPEND_IN_FLIGHT or pending[0].done()):
                done.add(pending.popleft().result())
            progress(done.count)
        writer.flush()
    finally:
        # Interrupted too (Ctrl-C while stdin waits): count what was acknowledged meanwhile.
        while pending and pending[0].done() and pending[0].exception() is None:
            done.add(pending.popleft().result())
    progress(done.count)


@contextlib.contextmanager
def _append_progress(console: Console) -> Iterator[Callable[[int], None]]:
    """A live count of acknowledged entries on a terminal; nothing otherwise."""
    if not console.is_terminal:
        yield lambda _: None
        return
    with Progress(
        TextColumn("appending"),
        TextColumn("{task.completed} acknowledged"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("append", total=None)
        yield lambda count: bar.update(task, completed=count)


def _tail(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    show = _entry_json if wants_json(args) else _entry_line
    with _client(args) as client:
        reader = client.open_reader(args.name)
        if args.start_time_ms is None:
            entries = reader.tail(args.start, timeout_s=args.timeout)
        else:
            entries = reader.tail(timeout_s=args.timeout, start_time_ms=args.start_time_ms)
        # Closed before the client: a tail cut short by --max-entries stops its reads on the
        # client's loop while that still runs.
        with contextlib.closing(cast(Generator[Any, None, None], entries)):
            for entry in itertools.islice(entries, args.max_entries):
                out.write(show(entry, args.show_ids))
                out.flush()
    return 0


def _entry_line(entry: Entry, show_ids: bool) -> bytes:
    """An entry as `streamctl tail` prints it: [id, time,] key=K and name=value for its key
    and headers (nothing for an entry without), then the payload; tab-separated."""
    fields = [f"{entry.entry_id}\t{entry.timestamp.isoformat()}\t".encode()] if show_ids else []
    if entry.key is not None:
        fields.append(b"key=" + entry.key + b"\t")
    fields.extend(name.encode() + b"=" + value + b"\t" for name, value in entry.headers)
    fields.append(entry.payload + b"\n")
    return b"".join(fields)


def _text(value: bytes) -> str:
    """`value` for JSON: UTF-8, with bytes that are not as \\xNN escapes."""
    return value.decode(errors="backslashreplace")


def _entry_json(entry: Entry, show_ids: bool) -> bytes:
    """An entry as one JSON line of `streamctl tail --output json` (ids and time always): the
    payload and key as text when they are UTF-8, else as `payload_base64` / `key_base64`
    (nothing is lost); header values as text (other bytes as \\xNN)."""
    value: dict[str, Any] = {
        "entry_id": entry.entry_id,
        "timestamp": entry.timestamp.isoformat(),
        "timestamp_ms": entry.timestamp_ms,
        "key": None,
        "headers": [[name, _text(value)] for name, value in entry.headers],
    }
    _put_bytes(value, "payload", entry.payload)
    if entry.key is not None:
        _put_bytes(value, "key", entry.key)
    return (json.dumps(value, sort_keys=True) + "\n").encode()


def _put_bytes(value: dict[str, Any], name: str, data: bytes) -> None:
    """Sets `value[name]` to `data` as UTF-8 text, or `value[name + "_base64"]` when it is not."""
    try:
        value[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        value[name + "_base64"] = base64.b64encode(data).decode("ascii")


def _info(args: argparse.Namespace) -> int:
    from stream.retention.units import format_size

    with _client(args) as client:
        info = client.stream_info(args.name)
    if wants_json(args):
        print_json(dataclasses.asdict(info))
        return 0
    console = output_console()
    summary = Table(title=f"stream {info.name}", show_header=False)
    for key, value in (
        ("id", info.stream_id),
        ("term", info.term),
        ("state", info.state),
        ("LAC", info.lac),
        ("first entry", info.first_entry_id),
        ("E / WQ / AQ", f"{info.ensemble_size} / {info.write_quorum} / {info.ack_quorum}"),
        ("writer", info.writer or "-"),
        *((("waiting for", info.waiting_for),) if info.waiting_for else ()),
    ):
        summary.add_row(key, str(value))
    console.print(summary)
    bookies = Table(title="last fragment's bookies")
    for column in ("bookie", "state", "limbo"):
        bookies.add_column(column)
    for bookie in info.bookies:
        limbo = "?" if bookie.limbo is None else ("yes" if bookie.limbo else "no")
        bookies.add_row(bookie.bookie_id, bookie.state, limbo)
    console.print(bookies)
    fragments = Table(title="fragments")
    for column in ("first entry", "last entry", "ensemble", "bytes"):
        fragments.add_column(column)
    for fragment in info.fragments:
        fragments.add_row(
            str(fragment.first_entry_id),
            "open" if fragment.last_entry_id is None else str(fragment.last_entry_id),
            ", ".join(fragment.ensemble),
            "-" if fragment.bytes is None else format_size(fragment.bytes),
        )
    console.print(fragments)
    if info.cursors:
        from stream.cli.cursors import cursor_row, cursor_table

        rows = [cursor_row(name, lag) for name, lag in info.cursors.items()]
        console.print(cursor_table(rows, "cursors"))
    # Where each term began: a takeover's term starts at its truncate no-op.
    history = Table(title="term history")
    for column in ("term", "first entry"):
        history.add_column(column)
    for term, first in info.term_history:
        history.add_row(str(term), str(first))
    console.print(history)
    if info.accepted_losses:
        losses = Table(title="entries given up by recover --accept-loss")
        for column in ("term", "entries", "bookies in limbo", "by", "at (UTC)"):
            losses.add_column(column)
        for loss in info.accepted_losses:
            at = datetime.datetime.fromtimestamp(loss.at_ms / 1000, datetime.UTC)
            losses.add_row(
                str(loss.term),
                f"{loss.first_entry_id}..{loss.last_entry_id}",
                ", ".join(loss.limbo_bookies),
                loss.operator,
                at.isoformat(timespec="seconds"),
            )
        console.print(losses)
    return 0


def _trim(args: argparse.Namespace) -> int:
    with _client(args) as client:
        previous_first = client.stream_info(args.name).first_entry_id
        first = client.trim(args.name, before_entry_id=args.before)
    if first == previous_first:
        # Only whole closed fragments below --before go; the last one is never trimmed.
        Console().print(
            f"nothing was trimmed: no closed fragment of {args.name} lies wholly below entry "
            f"{args.before}; the first retained entry stays {first}"
        )
    else:
        Console().print(f"trimmed {args.name}: first retained entry {previous_first} -> {first}")
    return 0


def _seal(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.seal_stream(args.name)
    Console().print(f"sealed {args.name}")
    return 0


def _survey_dict(survey: Any) -> dict[str, Any]:
    return {
        "stream": survey.stream,
        "term": survey.term,
        "state": survey.state,
        "bookies": [dataclasses.asdict(b) for b in survey.bookies],
        "limbo_bookies": list(survey.limbo_bookies),
        "unreachable_bookies": list(survey.unreachable_bookies),
        "last_held_entry_id": survey.last_held_entry_id,
        "lac": survey.lac,
        "first_at_risk": survey.first_at_risk,
        "last_at_risk": survey.last_at_risk,
    }


def _print_survey(console: Console, survey: Any) -> None:
    table = Table(title=f"stream {survey.stream}: bookies of the last fragment")
    for column in ("bookie", "answered", "limbo", "last entry held", "LAC"):
        table.add_column(column)
    for b in survey.bookies:
        table.add_row(
            b.bookie_id,
            "yes" if b.reachable else "NO",
            "LIMBO" if b.limbo else "-",
            str(b.last_entry_id) if b.reachable else "?",
            str(b.lac) if b.reachable else "?",
        )
    console.print(table)
    console.print(
        f"term {survey.term}, {survey.state}. The previous term would end after entry "
        f"{survey.last_held_entry_id}, the last one a bookie still holds. May be lost: entries "
        f"{survey.first_at_risk}..{survey.last_at_risk} (at most what the previous writer "
        f"could have acknowledged)."
    )
    if survey.lac >= survey.first_at_risk:
        console.print(
            f"[bold red]Certainly lost[/]: entries {survey.first_at_risk}..{survey.lac} were "
            "acknowledged (the LAC passed them) and no reachable bookie holds them."
        )


def _confirmed(console: Console, survey: Any) -> bool:
    """Asks on the terminal; without one (a script, a pipe) nothing is confirmed."""
    if not sys.stdin.isatty():
        return False
    answer = console.input(
        f"Give up entries {survey.first_at_risk}..{survey.last_at_risk} of {survey.stream} "
        f"that bookies {', '.join(survey.limbo_bookies)} may have lost? Type 'yes': "
    )
    return answer.strip() == "yes"


def _recover(args: argparse.Namespace) -> int:
    as_json = args.output == "json"
    err = Console(stderr=True, soft_wrap=True)
    console = err if as_json else Console(soft_wrap=True)
    if not args.accept_loss:
        err.print(
            "streamctl recover: only --accept-loss is run by hand (a writer's takeover recovers "
            "a stream otherwise); read what it gives up first: docs/operations.md, Recovery"
        )
        return ExitCode.USAGE
    with _client(args) as client:
        survey = client.survey_loss(args.name)
        report: dict[str, Any] = {"survey": _survey_dict(survey), "accepted_loss": None}
        _print_survey(console, survey)
        done = False
        if not survey.limbo_bookies:
            unreachable = survey.unreachable_bookies
            console.print(
                "No bookie of the last fragment is in limbo: nothing to give up."
                + (f" Bookies {', '.join(unreachable)} did not answer." if unreachable else "")
            )
            code = ExitCode.UNAVAILABLE if unreachable else ExitCode.OK
        elif not args.yes and not _confirmed(console, survey):
            err.print("not confirmed (no terminal to ask on: pass --yes); nothing was changed")
            code = ExitCode.USAGE
        else:
            loss = client.recover_accepting_loss(args.name)
            done = True
            code = ExitCode.OK
            if loss is None:
                console.print(f"recovered {args.name}: no limbo stood in the way, nothing given up")
            else:
                report["accepted_loss"] = loss.to_dict()
                console.print(
                    f"recovered {args.name} in term {loss.term}: gave up entries "
                    f"{loss.first_entry_id}..{loss.last_entry_id} (bookies in limbo: "
                    f"{', '.join(loss.limbo_bookies)}); recorded in its metadata as done by "
                    f"{loss.operator}. It is writable again; its bookies now leave limbo."
                )
    if as_json:
        report["recovered"] = done
        sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")
    return code


def _delete(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.delete_stream(args.name, force=args.force)
    Console().print(f"deleted {args.name}")
    return 0


def _list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        names = client.list_streams()
    if wants_json(args):
        print_json_lines({"name": name} for name in names)
    else:
        sys.stdout.writelines(f"{name}\n" for name in names)
    return 0
