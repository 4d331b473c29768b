"""Bookie cookies (BP-46 "A note on cookies"): the bookie's identity, written at first boot to
ZooKeeper (`/bookies/cookies/<bookie_id>`) and to a `COOKIE` file in each of its directories,
and checked at every later boot.

A directory without its cookie is a disk that was replaced or wiped: what the bookie
acknowledged there may be gone, and serving from it could answer "no such entry" for an entry
it once acknowledged. A directory holding another bookie's (or another incarnation's) cookie
was swapped or restored from elsewhere.

Some mismatches phase one can make safe (docs/design.md §4): an emptied directory, or a
configuration that moved the bookie's address or directories. With `auto_fix_cookie = true`, or by
hand with `streamctl bookie fix-cookie`, the boot then runs phase one (term fence and limbo for
every open stream naming the bookie) and only then rewrites the cookie; phase two copies back what
was lost. The others (foreign or unreadable cookies, data without a cookie, another cluster)
always need an operator: no automatic rule can tell whose data a directory holds.

`decide_cookies` is the pure decision; `inspect_cookies`, `check_cookies` and
`apply_cookie_fix` do the I/O around it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Protocol

from stream.bookie.config import BookieConfig
from stream.bookie.storage.fsutil import fsync_dir, write_file_durably
from stream.errors import CookieMismatchError, StreamError
from stream.logs import get_logger
from stream.protocol.invariant import invariant

log = get_logger(__name__)

COOKIE_FILE = "COOKIE"
COOKIE_FORMAT_VERSION = 1
DIRECTORY_NAMES = ("journal", "ledgers", "index")
# Entries of a directory that are not the bookie's data: the cookie itself, its temporary file
# while it is written, and the ext4 mount-point directory.
_NOT_DATA = frozenset({COOKIE_FILE, COOKIE_FILE + ".tmp", "lost+found"})

FIX_COMMAND = "streamctl bookie fix-cookie"
FIX_COOKIE_HINT = (
    "The bookie refuses to start. Find out what happened to the directory first; then, with "
    f"the bookie stopped, `{FIX_COMMAND} --config <bookie.toml>` (or `auto_fix_cookie = true`) "
    "protects every open stream naming this bookie (phase one: term fence and limbo) and "
    "rewrites the cookie; the bookie then copies what it lost back from its peers."
)
UNFIXABLE_HINT = (
    "The bookie refuses to start, and neither auto_fix_cookie nor "
    f"`{FIX_COMMAND}` repairs this: a directory holds data that may not be this bookie's. "
    "Restore the right directory, or empty it (the bookie then rebuilds it from its peers)."
)


@dataclass(frozen=True)
class Cookie:
    """A bookie's identity: who it is, where it listens, which directories hold its data, which
    cluster it belongs to, and a random id made at first boot that no other boot repeats."""

    bookie_id: str
    address: str
    directories: Mapping[str, str]  # journal | ledgers | index -> absolute path
    instance_id: str
    cookie_id: str

    def to_json(self) -> bytes:
        """Returns the cookie as canonical JSON bytes (sorted keys: equal cookies, equal bytes)."""
        body = {
            "version": COOKIE_FORMAT_VERSION,
            "bookie_id": self.bookie_id,
            "address": self.address,
            "directories": dict(sorted(self.directories.items())),
            "instance_id": self.instance_id,
            "cookie_id": self.cookie_id,
        }
        return (json.dumps(body, sort_keys=True, indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes) -> Cookie:
        """Returns the cookie in `data`; raises ValueError when it is not a cookie."""
        try:
            body = json.loads(data.decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"not JSON: {e}") from e
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
        if body.get("version") != COOKIE_FORMAT_VERSION:
            raise ValueError(f"unknown cookie format version {body.get('version')!r}")
        text_fields = ("bookie_id", "address", "instance_id", "cookie_id")
        for name in text_fields:
            if not isinstance(body.get(name), str):
                raise ValueError(f"field {name!r} missing or not a string")
        dirs = body.get("directories")
        if (
            not isinstance(dirs, dict)
            or set(dirs) != set(DIRECTORY_NAMES)
            or not all(isinstance(v, str) for v in dirs.values())
        ):
            raise ValueError(f"field 'directories' must map {', '.join(DIRECTORY_NAMES)} to paths")
        return cls(directories=dict(dirs), **{name: body[name] for name in text_fields})


def cookie_differences(a: Cookie, b: Cookie, *, ignore_cookie_id: bool = False) -> list[str]:
    """Returns the names of the fields in which `a` and `b` differ (`directories.<name>` for a
    directory), in a stable order; empty when they are equal."""
    diffs = []
    for f in dataclasses.fields(Cookie):
        if f.name == "cookie_id" and ignore_cookie_id:
            continue
        if f.name == "directories":
            for name in sorted(set(a.directories) | set(b.directories)):
                if a.directories.get(name) != b.directories.get(name):
                    diffs.append(f"directories.{name}")
        elif getattr(a, f.name) != getattr(b, f.name):
            diffs.append(f.name)
    return diffs


def _field_value(cookie: Cookie, field: str) -> str:
    if field.startswith("directories."):
        return str(cookie.directories.get(field.split(".", 1)[1]))
    return str(getattr(cookie, field))


def _describe(diffs: list[str], have: Cookie, want: Cookie, have_name: str, want_name: str) -> str:
    return "; ".join(
        f"{d}: {have_name} has {_field_value(have, d)!r}, {want_name} has {_field_value(want, d)!r}"
        for d in diffs
    )


def expected_cookie(config: BookieConfig, instance_id: str, cookie_id: str | None = None) -> Cookie:
    """Returns the cookie that `config` describes in cluster `instance_id`, with `cookie_id`
    (a fresh uuid4 when None: the cookie a first boot writes)."""
    return Cookie(
        bookie_id=config.bookie_id,
        address=config.listen,
        directories={name: os.path.abspath(path) for name, path in config.directories.items()},
        instance_id=instance_id,
        cookie_id=cookie_id or str(uuid.uuid4()),
    )


@dataclass(frozen=True)
class DirectoryState:
    """What one directory holds: its cookie (None when absent), why its cookie could not be
    read (None when it could or when absent), and whether it holds any other file."""

    name: str
    path: str
    cookie: Cookie | None
    cookie_error: str | None
    has_data: bool


class CookieAction(Enum):
    VERIFIED = "verified"  # every cookie matches: a normal boot
    FIRST_BOOT = "first_boot"  # nothing anywhere: write the cookie everywhere
    RESUME_FIRST_BOOT = "resume_first_boot"  # a first boot stopped before finishing: finish it
    FIX = "fix"  # a repairable mismatch: phase one first, then rewrite the cookie


@dataclass(frozen=True)
class CookieDecision:
    """What to do: the action, the cookie of this bookie, the directories (names) whose cookie
    must be written, and whether the cookie must be written to ZooKeeper (created when
    `zk_version` is None, else replaced at that version).

    For FIX also: `problems` (what was found, for the logs) and `lost_directories`, the
    directories that lost their cookie (and so their data); when there is any, the index is
    discarded before the storage opens (it may point into lost files, or lack truncations the
    lost journal held) and the bookie rebuilds from its peers."""

    action: CookieAction
    cookie: Cookie
    write_directories: tuple[str, ...]
    write_zookeeper: bool
    zk_version: int | None = None
    problems: tuple[str, ...] = ()
    lost_directories: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Problem:
    text: str
    fixable: bool
    lost_directory: str | None = None


# Cookie fields that may change while the data stays this bookie's: a new address or moved
# directories (set by the operator in the config).
def _movable(diffs: list[str]) -> bool:
    return all(d == "address" or d.startswith("directories.") for d in diffs)


def _zk_problems(
    expected: Cookie, zk_cookie: Cookie, directories: list[DirectoryState]
) -> list[_Problem]:
    problems: list[_Problem] = []
    diffs = cookie_differences(zk_cookie, expected, ignore_cookie_id=True)
    if diffs:
        problems.append(
            _Problem(
                "the configuration no longer matches the cookie registered in ZooKeeper ("
                + _describe(diffs, zk_cookie, expected, "ZooKeeper", "config")
                + ")",
                fixable=_movable(diffs),
            )
        )
    for d in directories:
        if d.cookie is None:
            where = f"directory {d.name} ({d.path})"
            if d.has_data:
                problems.append(
                    _Problem(
                        f"{where} has no cookie although ZooKeeper has one, but holds data: "
                        "it may come from another bookie or another disk",
                        fixable=False,
                    )
                )
            else:
                problems.append(
                    _Problem(
                        f"{where} has no cookie although ZooKeeper has one: the disk may be "
                        "new, wiped or replaced, and entries this bookie acknowledged may be "
                        "lost",
                        fixable=True,
                        lost_directory=d.name,
                    )
                )
            continue
        diffs = cookie_differences(d.cookie, zk_cookie)
        if diffs:
            problems.append(
                _Problem(
                    f"directory {d.name} ({d.path}) holds a cookie that differs from "
                    "ZooKeeper's ("
                    + _describe(diffs, d.cookie, zk_cookie, "directory", "ZooKeeper")
                    + "): directories may have been swapped with another bookie's, or come "
                    "from another bookie or cluster",
                    # Same bookie, cluster and incarnation, older address or paths: the
                    # directory is ours (an interrupted fix or a moved directory).
                    fixable=_movable(diffs),
                )
            )
    return problems


def decide_cookies(
    expected: Cookie,
    zk_cookie: Cookie | None,
    zk_error: str | None,
    directories: list[DirectoryState],
    *,
    auto_fix_cookie: bool = False,
    fixing: bool = False,
    zk_version: int | None = None,
) -> CookieDecision:
    """Returns what the boot must do with cookies, or raises CookieMismatchError naming every
    directory and field that disagrees.

    `expected` is the cookie the config describes (its cookie_id is used only at a first boot);
    `zk_cookie` the one in ZooKeeper (None when absent or unreadable, with `zk_error` saying
    why) at znode version `zk_version`. A mismatch that phase one makes safe gives a FIX
    decision when `auto_fix_cookie` (a boot) or `fixing` (`streamctl bookie fix-cookie`) is
    set; any other mismatch always raises. Pure: no I/O."""
    problems: list[_Problem] = []
    for d in directories:
        if d.cookie_error is not None:
            problems.append(
                _Problem(
                    f"directory {d.name} ({d.path}) has an unreadable cookie ({d.cookie_error})",
                    fixable=False,
                )
            )
    if zk_error is not None:
        problems.append(
            _Problem(f"the cookie in ZooKeeper is unreadable ({zk_error})", fixable=False)
        )

    if not problems and zk_cookie is None:
        with_data = [d for d in directories if d.has_data]
        present = [(d, d.cookie) for d in directories if d.cookie is not None]
        if with_data:
            # Data with no registered identity: the metadata was reset, the bookie id was
            # reused, or these directories come from another cluster.
            names = ", ".join(f"{d.name} ({d.path})" for d in with_data)
            problems.append(
                _Problem(
                    f"ZooKeeper has no cookie for bookie {expected.bookie_id!r} but directories "
                    f"{names} hold data: the metadata may have been reset or these directories "
                    "belong to another bookie or cluster",
                    fixable=False,
                )
            )
        elif not present:
            return CookieDecision(
                CookieAction.FIRST_BOOT,
                expected,
                tuple(d.name for d in directories),
                write_zookeeper=True,
            )
        else:
            # Cookies but no data and nothing in ZooKeeper: a first boot that stopped after
            # writing some directory cookies. The bookie never served, so finishing is safe,
            # as long as those cookies are this bookie's.
            first = present[0][1]
            for d, cookie in present:
                diffs = cookie_differences(cookie, expected, ignore_cookie_id=True)
                if cookie != first:
                    diffs = diffs or ["cookie_id"]
                if diffs:
                    problems.append(
                        _Problem(
                            f"directory {d.name} ({d.path}) holds a cookie of another bookie "
                            "or configuration ("
                            + _describe(diffs, cookie, expected, "it", "config")
                            + ")",
                            fixable=False,
                        )
                    )
            if not problems:
                return CookieDecision(
                    CookieAction.RESUME_FIRST_BOOT,
                    first,
                    tuple(d.name for d in directories if d.cookie is None),
                    write_zookeeper=True,
                )

    if not problems and zk_cookie is not None:
        problems = _zk_problems(expected, zk_cookie, directories)
        if not problems:
            return CookieDecision(CookieAction.VERIFIED, zk_cookie, (), write_zookeeper=False)

    texts = tuple(p.text for p in problems)
    unfixable = [p.text for p in problems if not p.fixable]
    if not unfixable and (auto_fix_cookie or fixing):
        assert zk_cookie is not None  # every fixable problem compares against it
        # The same identity (cookie_id) with what the config says now: a fix interrupted
        # half-way finds cookies that differ only in fixable fields and finishes.
        cookie = dataclasses.replace(expected, cookie_id=zk_cookie.cookie_id)
        return CookieDecision(
            CookieAction.FIX,
            cookie,
            tuple(d.name for d in directories if d.cookie != cookie),
            write_zookeeper=zk_cookie != cookie,
            zk_version=zk_version,
            problems=texts,
            lost_directories=tuple(p.lost_directory for p in problems if p.lost_directory),
        )
    hint = UNFIXABLE_HINT if unfixable else FIX_COOKIE_HINT
    if unfixable and (auto_fix_cookie or fixing):
        hint += " Not repairable automatically: " + "; ".join(unfixable) + "."
    raise CookieMismatchError(
        f"cookie mismatch for bookie {expected.bookie_id!r}: " + "; ".join(texts) + ". " + hint,
        bookie=expected.bookie_id,
    )


class CookieStore(Protocol):
    """Where the registered cookie lives (the ZooKeeper bookie registry)."""

    def read_cookie(self, bookie_id: str) -> tuple[bytes, int] | None: ...

    def write_cookie(self, bookie_id: str, data: bytes, version: int | None) -> int: ...


def read_directory_state(name: str, path: Path) -> DirectoryState:
    """Returns what directory `path` holds (an absent directory holds nothing)."""
    abspath = os.path.abspath(path)
    try:
        names = set(os.listdir(abspath))
    except FileNotFoundError:
        return DirectoryState(name, abspath, None, None, has_data=False)
    cookie: Cookie | None = None
    error: str | None = None
    if COOKIE_FILE in names:
        try:
            cookie = Cookie.from_json(Path(abspath, COOKIE_FILE).read_bytes())
        except (OSError, ValueError) as e:
            error = str(e)
    return DirectoryState(name, abspath, cookie, error, has_data=bool(names - _NOT_DATA))


def write_directory_cookie(path: Path, cookie: Cookie) -> None:
    """Writes `cookie` to `path/COOKIE` durably (temporary file, fsync, rename, fsync dir),
    creating the directory when needed."""
    path.mkdir(parents=True, exist_ok=True)
    write_file_durably(path / COOKIE_FILE, cookie.to_json())


def _read_zk_cookie(
    store: CookieStore, bookie_id: str
) -> tuple[Cookie | None, str | None, int | None]:
    """Returns (cookie, why it is unreadable, znode version) of the ZooKeeper cookie."""
    found = store.read_cookie(bookie_id)
    if found is None:
        return None, None, None
    try:
        return Cookie.from_json(found[0]), None, found[1]
    except ValueError as e:
        return None, str(e), found[1]


def inspect_cookies(
    config: BookieConfig, instance_id: str, store: CookieStore, *, fixing: bool = False
) -> CookieDecision:
    """Returns the cookie decision for `config` in cluster `instance_id` (reads the
    directories and ZooKeeper, writes nothing); raises CookieMismatchError as
    `decide_cookies` does. `fixing`: decide for `streamctl bookie fix-cookie`."""
    expected = expected_cookie(config, instance_id)
    directories = [read_directory_state(n, p) for n, p in config.directories.items()]
    zk_cookie, zk_error, zk_version = _read_zk_cookie(store, config.bookie_id)
    return decide_cookies(
        expected,
        zk_cookie,
        zk_error,
        directories,
        auto_fix_cookie=config.auto_fix_cookie,
        fixing=fixing,
        zk_version=zk_version,
    )


def check_cookies(config: BookieConfig, instance_id: str, store: CookieStore) -> CookieDecision:
    """Returns the cookie decision for this boot, with a first boot's cookies written;
    raises CookieMismatchError when the directories and ZooKeeper disagree (unless
    `auto_fix_cookie` makes it a FIX decision: then nothing is written yet, the boot runs
    phase one and `apply_cookie_fix` afterwards).

    A first boot writes the directory cookies before the ZooKeeper one: a crash in between
    leaves cookies without data and nothing in ZooKeeper, which the next boot finishes."""
    decision = inspect_cookies(config, instance_id, store)
    if decision.action is CookieAction.VERIFIED:
        log.info("cookie.verified", cookie_id=decision.cookie.cookie_id)
        return decision
    if decision.action is CookieAction.FIX:
        log.warning(
            "cookie.mismatch_to_fix",
            problems=list(decision.problems),
            lost_directories=list(decision.lost_directories),
        )
        return decision
    for name in decision.write_directories:
        write_directory_cookie(config.directories[name], decision.cookie)
    if decision.write_zookeeper:
        try:
            store.write_cookie(config.bookie_id, decision.cookie.to_json(), None)
        except Exception:
            # Another process created it first (two bookies with one id?): it must be ours.
            zk_cookie, _, _ = _read_zk_cookie(store, config.bookie_id)
            if zk_cookie != decision.cookie:
                raise CookieMismatchError(
                    f"cookie mismatch for bookie {config.bookie_id!r}: another process "
                    "registered a different cookie in ZooKeeper while this bookie booted for "
                    "the first time (is the bookie id used twice?)",
                    bookie=config.bookie_id,
                ) from None
    log.info(
        "cookie.written",
        action=decision.action.value,
        cookie_id=decision.cookie.cookie_id,
        directories=list(decision.write_directories),
    )
    return decision


def discard_index_for_fix(config: BookieConfig, decision: CookieDecision) -> list[str]:
    """Deletes the index's files (not its cookie) when the FIX decision lost a directory, so
    that the storage opens empty of locations and stream states and the repair rebuilds them;
    returns the names deleted. Call before the storage opens.

    A lost entry-log directory leaves index locations pointing nowhere; a lost journal may
    have held truncations or terms not yet in the index; a lost index knows nothing anyway.
    The entry logs left behind hold no live entry then, and GC deletes them."""
    if decision.action is not CookieAction.FIX or not decision.lost_directories:
        return []
    index_path = config.index_path
    deleted: list[str] = []
    try:
        names = sorted(os.listdir(index_path))
    except FileNotFoundError:
        return []
    for name in names:
        if name in _NOT_DATA:
            continue
        path = index_path / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
        deleted.append(name)
    if deleted:
        fsync_dir(index_path)
    log.warning("cookie.index_discarded", path=str(index_path), files=deleted)
    return deleted


def apply_cookie_fix(config: BookieConfig, decision: CookieDecision, store: CookieStore) -> None:
    """Writes the FIX decision's cookie to ZooKeeper (a versioned replace) and then to every
    directory that lacks it. Call only once phase one is durable: the new cookie is what lets
    later boots skip it. Raises `CookieMismatchError` when ZooKeeper's cookie changed since
    it was read (another process fixing the same bookie?)."""
    invariant(decision.action is CookieAction.FIX, "apply_cookie_fix needs a FIX decision")
    if decision.write_zookeeper:
        try:
            store.write_cookie(config.bookie_id, decision.cookie.to_json(), decision.zk_version)
        except StreamError as e:
            raise CookieMismatchError(
                f"cookie mismatch for bookie {config.bookie_id!r}: the cookie in ZooKeeper "
                f"changed while it was being fixed ({e}); is another process fixing it?",
                bookie=config.bookie_id,
            ) from e
    for name in decision.write_directories:
        write_directory_cookie(config.directories[name], decision.cookie)
    log.warning(
        "cookie.fixed",
        cookie_id=decision.cookie.cookie_id,
        directories=list(decision.write_directories),
        zookeeper=decision.write_zookeeper,
        problems=list(decision.problems),
    )
