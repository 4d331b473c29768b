"""Bookie cookies (BP-46 "A note on cookies"): the bookie's identity, written at first boot to
ZooKeeper (`/bookies/cookies/<bookie_id>`) and to a `COOKIE` file in each of its directories,
and checked at every later boot.

A directory without its cookie is a disk that was replaced or wiped: what the bookie
acknowledged there may be gone, and serving from it could answer "no such entry" for an entry
it once acknowledged. A directory holding another cookie was swapped with another bookie's. In
both cases the bookie must not serve until an operator (or, later, `auto_fix_cookie`) repairs it
with phase one (DESIGN §4).

`decide_cookies` is the pure decision; `check_cookies` does the I/O around it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Protocol

import structlog

from stream.bookie.config import BookieConfig
from stream.errors import CookieMismatchError

log = structlog.get_logger(__name__)

COOKIE_FILE = "COOKIE"
COOKIE_FORMAT_VERSION = 1
DIRECTORY_NAMES = ("journal", "ledgers", "index")
# Entries of a directory that are not the bookie's data: the cookie itself, its temporary file
# while it is written, and the ext4 mount-point directory.
_NOT_DATA = frozenset({COOKIE_FILE, COOKIE_FILE + ".tmp", "lost+found"})

FIX_COOKIE_HINT = (
    "The bookie refuses to start. Find out what happened to the directory first; then "
    "`streamctl bookie fix-cookie` (the operator's repair tool, coming in a later release) "
    "rewrites the cookie and protects every open stream (phase one: term fence and limbo)."
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


@dataclass(frozen=True)
class CookieDecision:
    """What to do: the action, the cookie of this bookie, the directories (names) whose cookie
    must be written, and whether the cookie must be created in ZooKeeper."""

    action: CookieAction
    cookie: Cookie
    write_directories: tuple[str, ...]
    write_zookeeper: bool


def decide_cookies(
    expected: Cookie,
    zk_cookie: Cookie | None,
    zk_error: str | None,
    directories: list[DirectoryState],
    *,
    auto_fix_cookie: bool = False,
) -> CookieDecision:
    """Returns what the boot must do with cookies, or raises CookieMismatchError naming every
    directory and field that disagrees.

    `expected` is the cookie the config describes (its cookie_id is used only at a first boot);
    `zk_cookie` the one in ZooKeeper (None when absent or unreadable, with `zk_error` saying
    why). Pure: no I/O."""
    problems: list[str] = []
    for d in directories:
        if d.cookie_error is not None:
            problems.append(
                f"directory {d.name} ({d.path}) has an unreadable cookie ({d.cookie_error})"
            )
    if zk_error is not None:
        problems.append(f"the cookie in ZooKeeper is unreadable ({zk_error})")

    if not problems and zk_cookie is None:
        with_data = [d for d in directories if d.has_data]
        present = [(d, d.cookie) for d in directories if d.cookie is not None]
        if with_data:
            # Data with no registered identity: the metadata was reset, the bookie id was
            # reused, or these directories come from another cluster.
            names = ", ".join(f"{d.name} ({d.path})" for d in with_data)
            problems.append(
                f"ZooKeeper has no cookie for bookie {expected.bookie_id!r} but directories "
                f"{names} hold data: the metadata may have been reset or these directories "
                "belong to another bookie or cluster"
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
                        f"directory {d.name} ({d.path}) holds a cookie of another bookie or "
                        f"configuration ({_describe(diffs, cookie, expected, 'it', 'config')})"
                    )
            if not problems:
                return CookieDecision(
                    CookieAction.RESUME_FIRST_BOOT,
                    first,
                    tuple(d.name for d in directories if d.cookie is None),
                    write_zookeeper=True,
                )

    if not problems and zk_cookie is not None:
        diffs = cookie_differences(zk_cookie, expected, ignore_cookie_id=True)
        if diffs:
            problems.append(
                "the configuration no longer matches the cookie registered in ZooKeeper ("
                + _describe(diffs, zk_cookie, expected, "ZooKeeper", "config")
                + ")"
            )
        for d in directories:
            if d.cookie is None:
                problems.append(
                    f"directory {d.name} ({d.path}) has no cookie although ZooKeeper has one: "
                    "the disk may be new, wiped or replaced, and entries this bookie "
                    "acknowledged may be lost"
                )
            else:
                diffs = cookie_differences(d.cookie, zk_cookie)
                if diffs:
                    problems.append(
                        f"directory {d.name} ({d.path}) holds a cookie that differs from "
                        f"ZooKeeper's ("
                        + _describe(diffs, d.cookie, zk_cookie, "directory", "ZooKeeper")
                        + "): directories may have been swapped with another bookie's, or come "
                        "from another bookie or cluster"
                    )
        if not problems:
            return CookieDecision(CookieAction.VERIFIED, zk_cookie, (), write_zookeeper=False)

    hint = FIX_COOKIE_HINT
    if auto_fix_cookie:
        hint += " auto_fix_cookie = true is not available yet, so the mismatch is not repaired."
    raise CookieMismatchError(
        f"cookie mismatch for bookie {expected.bookie_id!r}: " + "; ".join(problems) + ". " + hint,
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
    tmp = path / (COOKIE_FILE + ".tmp")
    with open(tmp, "wb") as f:
        f.write(cookie.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / COOKIE_FILE)
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _read_zk_cookie(store: CookieStore, bookie_id: str) -> tuple[Cookie | None, str | None]:
    found = store.read_cookie(bookie_id)
    if found is None:
        return None, None
    try:
        return Cookie.from_json(found[0]), None
    except ValueError as e:
        return None, str(e)


def check_cookies(config: BookieConfig, instance_id: str, store: CookieStore) -> CookieDecision:
    """Returns the verified (or newly written) cookie decision for this boot; raises
    CookieMismatchError when the directories and ZooKeeper disagree.

    A first boot writes the directory cookies before the ZooKeeper one: a crash in between
    leaves cookies without data and nothing in ZooKeeper, which the next boot finishes."""
    expected = expected_cookie(config, instance_id)
    directories = [read_directory_state(n, p) for n, p in config.directories.items()]
    zk_cookie, zk_error = _read_zk_cookie(store, config.bookie_id)
    decision = decide_cookies(
        expected, zk_cookie, zk_error, directories, auto_fix_cookie=config.auto_fix_cookie
    )
    if decision.action is CookieAction.VERIFIED:
        log.info("cookie.verified", cookie_id=decision.cookie.cookie_id)
        return decision
    for name in decision.write_directories:
        write_directory_cookie(config.directories[name], decision.cookie)
    if decision.write_zookeeper:
        try:
            store.write_cookie(config.bookie_id, decision.cookie.to_json(), None)
        except Exception:
            # Another process created it first (two bookies with one id?): it must be ours.
            zk_cookie, zk_error = _read_zk_cookie(store, config.bookie_id)
            if zk_cookie != decision.cookie:
                raise CookieMismatchError(
                    f"cookie mismatch for bookie {config.bookie_id!r}: another process "
                    "registered a different cookie in ZooKeeper while this bookie booted for "
                    "the first time (is the bookie id used twice?). " + FIX_COOKIE_HINT,
                    bookie=config.bookie_id,
                ) from None
    log.info(
        "cookie.written",
        action=decision.action.value,
        cookie_id=decision.cookie.cookie_id,
        directories=list(decision.write_directories),
    )
    return decision
