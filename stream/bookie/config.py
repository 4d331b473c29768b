"""bookie.toml: every key, its default and its check. An unknown key or a bad value stops the
bookie with a `ConfigError` that names the key."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stream.autorecovery.settings import AutoRecoverySettings
from stream.errors import ConfigError, InvalidArgumentError
from stream.protocol.placement import DEFAULT_MAX_ENTRY_BYTES
from stream.security.tls import TLSConfig

_BOOKIE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MiB = 1 << 20
_GiB = 1 << 30


def _check_address(key: str, value: str, *, allow_empty: bool = False) -> None:
    if allow_empty and value == "":
        return
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key} must be HOST:PORT", key=key, value=value)


@dataclass(frozen=True)
class BookieConfig:
    """One bookie's configuration. Defaults are documented beside each field; `CONFIG_KEYS` in
    stream.bookie.config_docs says what each key means for docs/operations.md. Sizes are bytes,
    durations milliseconds, ratios in [0, 1]."""

    # Required: who the bookie is, where it listens, where the metadata lives.
    bookie_id: str
    listen: str  # HOST:PORT of the gRPC service
    metadata: str  # ZooKeeper HOSTS/ROOT, e.g. "127.0.0.1:2181/streamkeeper"

    # Directories. journal/, ledgers/ and index/ sit inside data_dir unless set apart.
    data_dir: str = ""  # default: /var/lib/streamkeeper/<bookie_id>
    journal_dir: str = ""  # default: <data_dir>/journal
    ledger_dir: str = ""  # default: <data_dir>/ledgers (entry logs)
    index_dir: str = ""  # default: <data_dir>/index (LMDB)

    # Journal. With journal_write_data = false entries skip the journal (BP-46); term changes,
    # truncations, trims and limbo always go through it with fsync.
    journal_write_data: bool = True
    # Extra wait to grow a group commit, counted from its oldest record. Applied only while
    # adds stream in (records arrived during the previous sync); a record that finds the
    # journal idle is synced at once, so a lone writer does not pay it on every add.
    journal_max_group_wait_ms: float = 1.0
    journal_max_file_bytes: int = 256 * _MiB  # journal files rotate at this size

    # Write cache and entry logs.
    write_cache_max_bytes: int = 256 * _MiB  # a flush starts at half of this
    flush_interval_ms: int = 1000
    entry_log_size_limit_bytes: int = _GiB
    max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES  # larger entries: BAD_REQUEST

    # Garbage collection and compaction (BookKeeper's minor/major compaction).
    gc_interval_ms: int = 60_000  # delete entry logs with no live entry
    compaction_interval_ms: int = 3_600_000  # minor compaction round
    major_compaction_interval_ms: int = 86_400_000  # major compaction round
    minor_compaction_threshold: float = 0.2  # rewrite logs whose live ratio is below; 0 = off
    major_compaction_threshold: float = 0.8  # rewrite logs whose live ratio is below; 0 = off

    # Disk space: above this used fraction of a data disk the bookie turns read-only.
    disk_usage_threshold: float = 0.95
    disk_check_interval_ms: int = 10_000

    # Cookies (BP-46): repair a cookie mismatch automatically by running phase one.
    auto_fix_cookie: bool = False

    # Metadata session: a killed bookie's registration disappears after this timeout.
    metadata_session_timeout_ms: int = 10_000
    metadata_connect_timeout_ms: int = 30_000  # give up starting when ZooKeeper stays away
    metadata_auth_file: str = ""  # ZooKeeper identity and ACLs (stream.metadata.auth); "" = none

    # Serving.
    metrics_listen: str = "127.0.0.1:9181"  # Prometheus; "" turns the endpoint off
    grpc_max_message_bytes: int = 64 * _MiB
    # HTTP/2 receive window of one stream (gRPC "lookahead"). gRPC grants the sender more
    # window only as the handler reads, so with a small window a writer's MiB-sized Add
    # batches crawl in while the event loop is busy (measured: 1 KiB entries at full speed,
    # client send -> bookie receive of a 2 MB batch p50 70-140 ms). Memory stays bounded by
    # the writers' own in-flight limits (their window_bytes).
    grpc_stream_window_bytes: int = 16 * _MiB
    read_range_batch_bytes: int = _MiB
    read_lac_max_wait_ms: int = 60_000  # cap on a ReadLac long poll
    add_max_inflight_batches: int = 256  # per Add stream; the reader stops reading beyond it
    shutdown_grace_ms: int = 2_000  # on SIGTERM: time for in-flight requests to finish
    log_level: str = "info"

    # Security (docs/security.md). TLS is on when tls_cert_file is set; then the key and the
    # CA (which signed the clients' and the other bookies' certificates) are needed too.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    tls_client_auth: str = "require"  # "require": mutual TLS and roles; "none": TLS only
    # Plaintext gRPC on a non-loopback address is refused unless this says so.
    allow_insecure: bool = False
    # `[roles]`: principal (certificate common name) = role; overrides the certificate's role.
    roles: dict[str, str] = field(default_factory=dict, hash=False)  # config stays hashable

    # Auto-recovery (docs/design.md §7) in this process: an auditor candidate and replication
    # workers (stream.autorecovery.settings documents each key).
    autorecovery: bool = True
    lost_bookie_recovery_delay_ms: int = 30_000
    open_stream_replication_delay_ms: int = 30_000
    audit_interval_ms: int = 600_000
    scrub_interval_ms: int = 3_600_000
    scrub_full_interval_ms: int = 86_400_000  # 0 = never
    replication_workers: int = 1
    replication_rate_bytes: int = 0  # per worker; 0 = unlimited
    max_takeovers_per_audit: int = 16
    bookie_timeout_ms: int = 10_000

    def __post_init__(self) -> None:
        if not _BOOKIE_ID.match(self.bookie_id):
            raise ConfigError(
                "bookie_id must be 1-128 characters of letters, digits, '.', '_', '-'",
                key="bookie_id",
                value=self.bookie_id,
            )
        _check_address("listen", self.listen)
        _check_address("metrics_listen", self.metrics_listen, allow_empty=True)
        if ":" not in self.metadata.split("/", 1)[0]:
            raise ConfigError("metadata must be HOSTS[/ROOT]", key="metadata", value=self.metadata)
        positive = (
            "journal_max_file_bytes",
            "write_cache_max_bytes",
            "flush_interval_ms",
            "entry_log_size_limit_bytes",
            "max_entry_bytes",
            "gc_interval_ms",
            "compaction_interval_ms",
            "major_compaction_interval_ms",
            "disk_check_interval_ms",
            "grpc_max_message_bytes",
            "read_range_batch_bytes",
            "read_lac_max_wait_ms",
            "metadata_session_timeout_ms",
            "metadata_connect_timeout_ms",
            "add_max_inflight_batches",
            "grpc_stream_window_bytes",
        )
        for key in positive:
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be > 0", key=key, value=getattr(self, key))
        if self.journal_max_group_wait_ms < 0:
            raise ConfigError(
                "journal_max_group_wait_ms must be >= 0",
                key="journal_max_group_wait_ms",
                value=self.journal_max_group_wait_ms,
            )
        if self.shutdown_grace_ms < 0:
            raise ConfigError("shutdown_grace_ms must be >= 0", key="shutdown_grace_ms")
        for key in ("minor_compaction_threshold", "major_compaction_threshold"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"{key} must be in [0, 1)", key=key, value=getattr(self, key))
        if not 0.0 < self.disk_usage_threshold <= 1.0:
            raise ConfigError(
                "disk_usage_threshold must be in (0, 1]",
                key="disk_usage_threshold",
                value=self.disk_usage_threshold,
            )
        if self.max_entry_bytes + 4096 > self.grpc_max_message_bytes:
            raise ConfigError(
                "max_entry_bytes must leave room in grpc_max_message_bytes",
                key="max_entry_bytes",
                value=self.max_entry_bytes,
            )
        if self.entry_log_size_limit_bytes < self.max_entry_bytes + 64:
            raise ConfigError(
                "entry_log_size_limit_bytes must hold at least one entry",
                key="entry_log_size_limit_bytes",
            )
        self._check_security()
        self.autorecovery_settings()  # checks the auto-recovery keys
        if self.log_level.lower() not in {"debug", "info", "warning", "error"}:
            raise ConfigError(
                "log_level must be debug|info|warning|error", key="log_level", value=self.log_level
            )

    def _check_security(self) -> None:
        from stream.security.roles import Role

        files = ("tls_cert_file", "tls_key_file", "tls_ca_file")
        given = [key for key in files if getattr(self, key)]
        if given and len(given) != len(files):
            missing = next(key for key in files if key not in given)
            raise ConfigError(f"TLS needs {', '.join(files)}; {missing} is missing", key=missing)
        if self.tls_client_auth not in ("require", "none"):
            raise ConfigError(
                'tls_client_auth must be "require" or "none"',
                key="tls_client_auth",
                value=self.tls_client_auth,
            )
        for principal, role in self.roles.items():
            try:
                Role.parse(role)
            except InvalidArgumentError as e:
                raise ConfigError(
                    f"roles.{principal}: {e.message}", key="roles", value=role
                ) from None

    @property
    def tls(self) -> bool:
        """Whether the bookie serves (and calls its peers over) TLS."""
        return bool(self.tls_cert_file)

    def client_tls(self) -> TLSConfig | None:
        """Returns the TLS files the bookie calls other bookies with (its own certificate),
        None without TLS."""
        if not self.tls:
            return None
        return TLSConfig(self.tls_ca_file, self.tls_cert_file, self.tls_key_file)

    def autorecovery_settings(self) -> AutoRecoverySettings:
        """Returns the auto-recovery settings of this bookie's keys."""
        keys = [f.name for f in dataclasses.fields(AutoRecoverySettings)]
        try:
            return AutoRecoverySettings(**{k: getattr(self, k) for k in keys})
        except InvalidArgumentError as e:
            key = next((k for k in keys if k in e.context), "autorecovery")
            raise ConfigError(e.message, key=key, value=e.context.get(key)) from None

    # Resolved directories.
    @property
    def data_path(self) -> Path:
        return Path(self.data_dir or f"/var/lib/streamkeeper/{self.bookie_id}")

    @property
    def journal_path(self) -> Path:
        return Path(self.journal_dir) if self.journal_dir else self.data_path / "journal"

    @property
    def ledger_path(self) -> Path:
        return Path(self.ledger_dir) if self.ledger_dir else self.data_path / "ledgers"

    @property
    def metadata_auth_path(self) -> str | None:
        """Returns the metadata auth file, or None when metadata is not authenticated."""
        return self.metadata_auth_file or None

    @property
    def index_path(self) -> Path:
        return Path(self.index_dir) if self.index_dir else self.data_path / "index"

    @property
    def directories(self) -> dict[str, Path]:
        return {
            "journal": self.journal_path,
            "ledgers": self.ledger_path,
            "index": self.index_path,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BookieConfig:
        """Returns the config for `raw` (a parsed TOML table), checking names and types."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key in raw:
            if key not in fields:
                raise ConfigError(f"unknown key {key!r} in bookie config", key=key)
        for key in ("bookie_id", "listen", "metadata"):
            if key not in raw:
                raise ConfigError(f"missing required key {key!r}", key=key)
        values: dict[str, Any] = {}
        for key, value in raw.items():
            want = fields[key].type
            if want in ("bool", bool):
                ok = isinstance(value, bool)
            elif want in ("int", int):
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif want in ("float", float):
                ok = isinstance(value, int | float) and not isinstance(value, bool)
                value = float(value) if ok else value
            elif str(want).startswith("dict"):  # a table of strings: [roles]
                ok = isinstance(value, dict) and all(
                    isinstance(k, str) and isinstance(v, str) for k, v in value.items()
                )
            else:
                ok = isinstance(value, str)
            if not ok:
                raise ConfigError(
                    f"{key} must be of type {want}, got {type(value).__name__}",
                    key=key,
                    value=value,
                )
            values[key] = value
        return cls(**values)

    @classmethod
    def load(cls, path: str | Path) -> BookieConfig:
        """Returns the config read from the TOML file at `path`."""
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError as e:
            raise ConfigError("config file not found", path=str(path)) from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file is not valid TOML: {e}", path=str(path)) from e
        return cls.from_dict(raw)

    def to_toml(self) -> str:
        """Returns this config as TOML text (every key, for the sandbox and docs)."""
        lines = []
        tables: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):  # a table goes after every plain key
                tables.append(f"[{f.name}]")
                tables.extend(f"{_toml_string(k)} = {_toml_string(v)}" for k, v in value.items())
                continue
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, int | float):
                text = repr(value)
            else:
                text = _toml_string(str(value))
            lines.append(f"{f.name} = {text}")
        return "\n".join(lines + tables) + "\n"


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


DEFAULTS = {
    f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
    for f in dataclasses.fields(BookieConfig)
    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
}
