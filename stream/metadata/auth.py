"""The metadata auth file (`metadata_auth_file`): the ZooKeeper identity this process
authenticates as, and the ACL every znode it creates carries (all rights for that identity, read
for the configured read-only identities, nothing for anyone else).

The file is TOML, private to its owner (mode 0600 or stricter):

    scheme = "digest"                      # the only scheme supported
    identity = "streamkeeper:s3cret"       # USER:PASSWORD this process authenticates as
    read_identities = ["reader:pw"]        # optional: USER:PASSWORD granted READ
    read_digests = ["auditor:BASE64SHA1"]  # optional: pre-hashed USER:DIGEST granted READ
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import secrets
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.security import ACL, Id, Permissions, make_digest_acl, make_digest_acl_credential

from stream.errors import ConfigError

SCHEME_DIGEST = "digest"
_KEYS = ("scheme", "identity", "read_identities", "read_digests")
# A digest id's password part is base64(sha1(USER:PASSWORD)): 20 bytes.
_SHA1_BYTES = 20


@dataclass(frozen=True)
class MetadataAuth:
    """A parsed metadata auth file: `identity` (USER:PASSWORD) authenticates this process;
    `read_identities` (USER:PASSWORD) and `read_digests` (USER:DIGEST) may only read."""

    identity: str
    read_identities: tuple[str, ...] = ()
    read_digests: tuple[str, ...] = ()
    scheme: str = SCHEME_DIGEST

    @property
    def user(self) -> str:
        """Returns the user name of `identity` (safe to log; the password is not)."""
        return self.identity.partition(":")[0]

    def auth_data(self) -> list[tuple[str, str]]:
        """Returns kazoo's `auth_data`: the credentials sent on every (re)connection."""
        return [(self.scheme, self.identity)]

    def acl(self) -> list[ACL]:
        """Returns the ACL for every znode created: ALL for `identity`, READ for the readers."""
        user, _, password = self.identity.partition(":")
        acl = [make_digest_acl(user, password, all=True)]
        for reader in self.read_identities:
            name, _, secret = reader.partition(":")
            acl.append(make_digest_acl(name, secret, read=True))
        acl.extend(ACL(Permissions.READ, Id(SCHEME_DIGEST, d)) for d in self.read_digests)
        return acl

    def __repr__(self) -> str:
        # Keeps passwords out of logs and tracebacks.
        return f"MetadataAuth(user={self.user!r}, readers={len(self.readers())})"

    def readers(self) -> list[str]:
        """Returns the user names granted READ."""
        return [r.partition(":")[0] for r in (*self.read_identities, *self.read_digests)]


def digest_id(identity: str) -> str:
    """Returns the `USER:DIGEST` id of a `USER:PASSWORD` identity, as ZooKeeper stores it (what
    `read_digests` takes, so the cluster's file need not hold a reader's password)."""
    user, password = _identity(identity, "identity")
    digest: str = make_digest_acl_credential(user, password)  # kazoo is untyped
    return digest


def check_private(path: Path, key: str) -> None:
    """Returns None when `path` is a regular file no one but its owner may read or write; else
    raises `ConfigError` naming `key` (secrets in a world-readable file are not secret)."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"cannot read {key}", key=key, path=str(path), error=str(exc)) from exc
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{key} is not a regular file", key=key, path=str(path))
    if mode & 0o077:
        raise ConfigError(
            f"{key} may be read or changed by group or others: chmod 600 it",
            key=key,
            path=str(path),
            mode=oct(stat.S_IMODE(mode)),
        )


def load_metadata_auth(path: str | Path) -> MetadataAuth:
    """Returns the auth file at `path`, parsed and checked; raises `ConfigError` for a file that
    is missing, readable by group or others, not TOML, or with a bad or unknown key."""
    file = Path(path).expanduser()
    check_private(file, "metadata_auth_file")
    try:
        body = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(
            "cannot parse metadata_auth_file", key="metadata_auth_file", path=str(file)
        ) from exc
    return parse_metadata_auth(body, str(file))


def parse_metadata_auth(body: dict[str, Any], source: str = "<dict>") -> MetadataAuth:
    """Returns the auth of a parsed TOML table; raises `ConfigError` naming the bad key."""
    unknown = sorted(set(body) - set(_KEYS))
    if unknown:
        raise ConfigError(
            "unknown keys in metadata_auth_file", keys=unknown, allowed=list(_KEYS), path=source
        )
    scheme = body.get("scheme", SCHEME_DIGEST)
    if scheme != SCHEME_DIGEST:
        raise ConfigError(
            'metadata_auth_file: only scheme = "digest" is supported',
            key="scheme",
            value=scheme,
            path=source,
        )
    if "identity" not in body:
        raise ConfigError(
            "metadata_auth_file needs identity = USER:PASSWORD", key="identity", path=source
        )
    identity = ":".join(_identity(body["identity"], "identity", source))
    readers = tuple(
        ":".join(_identity(r, "read_identities", source))
        for r in _strings(body, "read_identities", source)
    )
    digests = tuple(_digest(d, source) for d in _strings(body, "read_digests", source))
    return MetadataAuth(identity=identity, read_identities=readers, read_digests=digests)


def write_metadata_auth_file(
    path: str | Path, identity: str | None = None, *, read_identities: tuple[str, ...] = ()
) -> Path:
    """Returns `path` after writing a new metadata auth file there, mode 0600, for `identity`
    (default: user `streamkeeper` with a random password) and `read_identities`. Raises
    `ConfigError` when the file exists (a cluster's identity is not overwritten by accident)
    or an identity is malformed; nothing is written then."""
    file = Path(path).expanduser()
    chosen = identity or f"streamkeeper:{secrets.token_urlsafe(24)}"
    body = {"scheme": SCHEME_DIGEST, "identity": chosen, "read_identities": list(read_identities)}
    parse_metadata_auth(body, str(file))
    # JSON strings are valid TOML basic strings.
    text = "".join(f"{key} = {json.dumps(value)}\n" for key, value in body.items())
    try:
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise ConfigError("metadata auth file exists already", path=str(file)) from exc
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    return file


def _strings(body: dict[str, Any], key: str, source: str) -> list[str]:
    value = body.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            f"metadata_auth_file: {key} must be a list of strings", key=key, path=source
        )
    return value


def _identity(value: object, key: str, source: str = "<value>") -> tuple[str, str]:
    """Returns `(user, password)` of a USER:PASSWORD string (the user has no ':')."""
    user, sep, password = value.partition(":") if isinstance(value, str) else ("", "", "")
    if not (sep and user.strip() == user and user and password):
        # The value is a secret: name the key, never echo it.
        raise ConfigError(
            f"metadata_auth_file: {key} must be USER:PASSWORD (both non-empty)",
            key=key,
            path=source,
        )
    return user, password


def _digest(value: str, source: str) -> str:
    """Returns a checked `USER:DIGEST` id (DIGEST the base64 sha1 `digest_id` prints)."""
    user, _, digest = value.partition(":")
    try:
        valid = bool(user) and len(base64.b64decode(digest, validate=True)) == _SHA1_BYTES
    except (binascii.Error, ValueError):
        valid = False
    if not valid:
        raise ConfigError(
            "metadata_auth_file: read_digests entries must be USER:BASE64-SHA1 (see digest_id)",
            key="read_digests",
            value=value,
            path=source,
        )
    return value
