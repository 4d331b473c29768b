"""bookie.toml: every key, its default and its check. An unknown key or a bad value stops the
bookie with a `ConfigError` that names the key."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from stream.addresses import split_host_port
from stream.autorecovery.settings import AutoRecoverySettings
from stream.errors import ConfigError, InvalidArgumentError, StreamError
from stream.protocol.placement import DEFAULT_MAX_ENTRY_BYTES
from stream.security.tls import TLSConfig
from stream.settings import NON_NEGATIVE, POSITIVE, Check, Settings, one_of, same_as, setting

_BOOKIE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MiB = 1 << 20
_GiB = 1 << 30


def _is_address(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


_ADDRESS = Check("HOST:PORT", _is_address)
_ADDRESS_OR_OFF = Check('HOST:PORT or ""', lambda v: v == "" or _is_address(v))
_RATIO_BELOW_ONE = Check("in [0, 1)", lambda v: 0.0 <= v < 1.0)
_AR = AutoRecoverySettings


@dataclass(frozen=True)
class BookieConfig(Settings):
    """One bookie's configuration: each key declares its unit, default, check and meaning
    (stream.bookie.config_docs turns them into the table of docs/operations.md). Sizes are
    bytes, durations milliseconds, ratios in [0, 1]."""

    error: ClassVar[type[StreamError]] = ConfigError

    # Required: who the bookie is, where it listens, where the metadata lives.
    bookie_id: str = setting(
        check=Check(
            "1-128 characters of letters, digits, '.', '_', '-'",
            lambda v: bool(_BOOKIE_ID.match(v)),
        ),
        doc="the bookie's name (`[A-Za-z0-9._-]`, up to 128 characters)",
    )
    listen: str = setting(check=_ADDRESS, doc="`HOST:PORT` of the gRPC service")
    metadata: str = setting(
        check=Check("HOSTS[/ROOT]", lambda v: ":" in v.split("/", 1)[0]),
        doc="ZooKeeper `HOSTS/ROOT`, e.g. `127.0.0.1:2181/streamkeeper`",
    )

    # Directories. journal/, ledgers/ and index/ sit inside data_dir unless set apart.
    data_dir: str = setting(
        "",
        doc="holds `journal/`, `ledgers/` and `index/` unless they are set apart",
        shown_default="`/var/lib/streamkeeper/<bookie_id>`",
    )
    journal_dir: str = setting(
        "",
        doc="the journal; put it on its own disk for fsync latency",
        shown_default="`<data_dir>/journal`",
    )
    ledger_dir: str = setting("", doc="the entry logs", shown_default="`<data_dir>/ledgers`")
    index_dir: str = setting("", doc="the LMDB index", shown_default="`<data_dir>/index`")

    # Journal.
    journal_write_data: bool = setting(
        True,
        doc="`false`: entries skip the journal (BP-46); term changes, "
        "truncations, trims and limbo still go through it with fsync",
    )
    # Group commits on the event loop, between its turns (the batches received in one turn
    # form a group), cost no thread hand-offs: a group's write and fdatasync release the GIL
    # but hold the loop, which is cheap where a sync takes a fraction of a millisecond (at
    # 15,000-20,000 appends/s a bookie took about 1 us less CPU per entry,
    # docs/benchmarks.md). Where a sync takes milliseconds (a disk without a power-safe write
    # cache), the thread lets the loop receive and read meanwhile.
    journal_thread: bool = setting(
        False,
        doc="`true`: group commits (write and fdatasync) run on a thread of their own, beside "
        "the event loop, which goes on serving meanwhile (for disks whose fdatasync takes "
        "milliseconds); `false`: on the event loop between its turns, without hand-offs",
    )
    # Counted from a group's oldest record and applied only while adds stream in (records
    # arrived during the previous sync); a record that finds the journal idle is synced at
    # once, so a lone writer does not pay it on every add.
    journal_max_group_wait_ms: float = setting(
        1.0,
        unit="ms",
        check=NON_NEGATIVE,
        doc="with `journal_thread`: extra wait to grow a group commit while adds stream in",
    )
    journal_max_file_bytes: int = setting(
        256 * _MiB,
        unit="bytes",
        check=POSITIVE,
        doc="journal files rotate at this size; two retired files are kept "
        "and overwritten as later ones",
    )

    # Write cache and entry logs.
    write_cache_max_bytes: int = setting(
        256 * _MiB,
        unit="bytes",
        check=POSITIVE,
        doc="in-memory write cache; a flush starts at half",
    )
    flush_interval_ms: int = setting(
        1000,
        unit="ms",
        check=POSITIVE,
        doc="the write cache is flushed to entry logs at least this often",
    )
    entry_log_size_limit_bytes: int = setting(
        _GiB, unit="bytes", check=POSITIVE, doc="entry logs rotate at this size"
    )
    max_entry_bytes: int = setting(
        DEFAULT_MAX_ENTRY_BYTES,
        unit="bytes",
        check=POSITIVE,
        doc="larger entries get `BAD_REQUEST`; published in the registration, so "
        "writers refuse a larger entry before sending it (`InvalidArgumentError`)",
    )

    # Garbage collection and compaction (BookKeeper's minor/major compaction).
    gc_interval_ms: int = setting(
        60_000,
        unit="ms",
        check=POSITIVE,
        doc="entry logs with no live entry are deleted; trims missed are reconciled",
    )
    compaction_interval_ms: int = setting(
        3_600_000, unit="ms", check=POSITIVE, doc="minor compaction round"
    )
    major_compaction_interval_ms: int = setting(
        86_400_000, unit="ms", check=POSITIVE, doc="major compaction round"
    )
    minor_compaction_threshold: float = setting(
        0.2,
        check=_RATIO_BELOW_ONE,
        doc="the minor round rewrites logs whose live ratio is below (0 = off)",
    )
    major_compaction_threshold: float = setting(
        0.8,
        check=_RATIO_BELOW_ONE,
        doc="the major round rewrites logs whose live ratio is below (0 = off)",
    )

    # Disk space.
    disk_usage_threshold: float = setting(
        0.95,
        check=Check("in (0, 1]", lambda v: 0.0 < v <= 1.0),
        doc="above this used fraction of a data disk the bookie turns read-only",
    )
    disk_check_interval_ms: int = setting(
        10_000, unit="ms", check=POSITIVE, doc="how often disk usage is checked"
    )

    # Cookies (BP-46).
    auto_fix_cookie: bool = setting(
        False,
        doc="repair a cookie mismatch (wiped or new disk, moved address) at boot by "
        "running phase one, then rebuild from peers (BP-46)",
    )

    # Metadata session.
    metadata_session_timeout_ms: int = setting(
        10_000,
        unit="ms",
        check=POSITIVE,
        doc="ZooKeeper session timeout: a killed bookie's registration disappears after it",
    )
    metadata_connect_timeout_ms: int = setting(
        30_000,
        unit="ms",
        check=POSITIVE,
        doc="give up starting when ZooKeeper stays away this long",
    )
    metadata_auth_file: str = setting(
        "",
        doc="ZooKeeper identity of the cluster (mode 0600 TOML, see Metadata "
        "authentication): every znode gets its ACL",
        shown_default="none (znodes open to every ZooKeeper client)",
    )

    # Serving.
    # Writers send their adds here and readers their range reads when the registration has it
    # (unless their `WriterOptions.data_port` or `ReaderOptions.data_port` is false): framed
    # TCP costs far less CPU per batch than a gRPC message (stream.wire.frames).
    data_listen: str = setting(
        "",
        check=_ADDRESS_OR_OFF,
        doc="`HOST:PORT` of the data port (Add streams and range reads framed over TCP, TLS as "
        '`listen`), published in the registration; `""` turns it off (clients use gRPC)',
    )
    metrics_listen: str = setting(
        "127.0.0.1:9181",
        check=_ADDRESS_OR_OFF,
        doc='Prometheus endpoint `HOST:PORT`; `""` turns it off',
    )
    grpc_max_message_bytes: int = setting(
        64 * _MiB,
        unit="bytes",
        check=POSITIVE,
        doc="largest gRPC message (an add batch)",
    )
    # gRPC "lookahead": gRPC grants the sender more window only as the handler reads, so with
    # a small window a writer's MiB-sized Add batches crawl in while the event loop is busy
    # (measured: 1 KiB entries at full speed, client send -> bookie receive of a 2 MB batch
    # p50 70-140 ms). Memory stays bounded by the writers' own in-flight limits (their
    # window_bytes).
    grpc_stream_window_bytes: int = setting(
        16 * _MiB,
        unit="bytes",
        check=POSITIVE,
        doc="HTTP/2 receive window of one gRPC stream: large add batches "
        "arrive without waiting for window updates",
    )
    read_range_batch_bytes: int = setting(
        _MiB, unit="bytes", check=POSITIVE, doc="size of one `ReadRange` answer"
    )
    read_lac_max_wait_ms: int = setting(
        60_000, unit="ms", check=POSITIVE, doc="cap on a `ReadLac` long poll"
    )
    add_max_inflight_batches: int = setting(
        256,
        check=POSITIVE,
        doc="per `Add` stream; the bookie stops reading beyond it",
    )
    shutdown_grace_ms: int = setting(
        2_000,
        unit="ms",
        check=NON_NEGATIVE,
        doc="on SIGTERM, time for in-flight requests to finish",
    )
    # uvloop (libuv's loop, a C implementation of asyncio's) serves the same code with less
    # CPU per request: each bookie 0.35-0.41 us less per entry at 20,000 appends/s
    # (docs/benchmarks.md). "asyncio" is the standard library's loop, should uvloop misbehave.
    event_loop: str = setting(
        "uvloop",
        check=one_of("uvloop", "asyncio"),
        doc='the event loop the bookie serves on: `"uvloop"` or `"asyncio"` (the standard '
        "library's)",
    )
    log_level: str = setting(
        "info",
        check=Check(
            "debug|info|warning|error",
            lambda v: v.lower() in {"debug", "info", "warning", "error"},
        ),
        doc="`debug`, `info`, `warning` or `error`",
    )

    # Security (docs/security.md). TLS is on when tls_cert_file is set; then the key and the
    # CA (which signed the clients' and the other bookies' certificates) are needed too.
    tls_cert_file: str = setting(
        "",
        doc="this bookie's certificate (PEM); setting it turns TLS on for the port "
        "and for calls to other bookies (docs/security.md)",
    )
    tls_key_file: str = setting(
        "", doc="its private key; refused unless only the owner may read it (0600)"
    )
    tls_ca_file: str = setting(
        "", doc="the CA that signed the clients' and the other bookies' certificates"
    )
    tls_client_auth: str = setting(
        "require",
        check=one_of("require", "none"),
        doc='`"require"`: callers need a certificate and roles apply; `"none"`: '
        "TLS encrypts only, no roles",
    )
    allow_insecure: bool = setting(
        False, doc="`true` lets a bookie without TLS listen on a non-loopback address"
    )
    roles: dict[str, str] = setting(
        default_factory=dict,
        hash=False,  # the config stays hashable
        doc="`[roles]` table, principal (certificate common name) = `reader`, `writer`, "
        "`service` or `admin`; overrides the role the certificate carries",
    )

    # Auto-recovery (docs/design.md §7) in this process: an auditor candidate and replication
    # workers, declared by AutoRecoverySettings.
    autorecovery: bool = setting(
        True, doc="run an auditor candidate and replication workers in this process"
    )
    lost_bookie_recovery_delay_ms: int = same_as(_AR, "lost_bookie_recovery_delay_ms")
    open_stream_replication_delay_ms: int = same_as(_AR, "open_stream_replication_delay_ms")
    audit_interval_ms: int = same_as(_AR, "audit_interval_ms")
    scrub_interval_ms: int = same_as(_AR, "scrub_interval_ms")
    scrub_full_interval_ms: int = same_as(_AR, "scrub_full_interval_ms")
    replication_workers: int = same_as(_AR, "replication_workers")
    replication_rate_bytes: int = same_as(_AR, "replication_rate_bytes")
    max_takeovers_per_audit: int = same_as(_AR, "max_takeovers_per_audit")
    bookie_timeout_ms: int = same_as(_AR, "bookie_timeout_ms")

    def check_together(self) -> None:
        if self.max_entry_bytes + 4096 > self.grpc_max_message_bytes:
            self.refuse(
                "max_entry_bytes",
                "max_entry_bytes must leave room in grpc_max_message_bytes",
                self.max_entry_bytes,
            )
        if self.entry_log_size_limit_bytes < self.max_entry_bytes + 64:
            self.refuse(
                "entry_log_size_limit_bytes",
                "entry_log_size_limit_bytes must hold at least one entry",
            )
        self._check_security()

    def _check_security(self) -> None:
        from stream.security.roles import Role

        files = ("tls_cert_file", "tls_key_file", "tls_ca_file")
        given = [key for key in files if getattr(self, key)]
        if given and len(given) != len(files):
            missing = next(key for key in files if key not in given)
            raise ConfigError(f"TLS needs {', '.join(files)}; {missing} is missing", key=missing)
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

    def data_bind(self) -> tuple[str, int] | None:
        """Returns the (host, port) the data port binds, None when it is off."""
        return split_host_port("data_listen", self.data_listen) if self.data_listen else None

    def client_tls(self) -> TLSConfig | None:
        """Returns the TLS files the bookie calls other bookies with (its own certificate),
        None without TLS."""
        if not self.tls:
            return None
        return TLSConfig(self.tls_ca_file, self.tls_cert_file, self.tls_key_file)

    def autorecovery_settings(self) -> AutoRecoverySettings:
        """Returns the auto-recovery settings of this bookie's keys (checked with the rest)."""
        keys = [f.name for f in dataclasses.fields(AutoRecoverySettings)]
        return AutoRecoverySettings(**{k: getattr(self, k) for k in keys})

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
        # TOML has no float for a whole number: a float key takes an integer.
        floats = {f.name for f in dataclasses.fields(cls) if f.type in ("float", float)}
        values: dict[str, Any] = {
            key: float(value)
            if key in floats and isinstance(value, int) and not isinstance(value, bool)
            else value
            for key, value in raw.items()
        }
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


def _default(f: dataclasses.Field[Any]) -> Any:
    factory = f.default_factory
    return f.default if factory is dataclasses.MISSING else factory()


DEFAULTS = {
    f.name: _default(f)
    for f in dataclasses.fields(BookieConfig)
    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
}
