"""A local cluster on 127.0.0.1: one ZooKeeper (or an ensemble), N bookie processes and
(optionally) the retention service. Used by `streamctl sandbox`, the integration tests and the
benchmarks."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from stream.errors import InvalidArgumentError, StreamError
from stream.logs import get_logger
from stream.metadata.auth import MetadataAuth, load_metadata_auth, write_metadata_auth_file
from stream.metadata.connection import kazoo_auth_options
from stream.sandbox.bookies import BookieProcess, stop_all
from stream.sandbox.retention import RetentionProcess
from stream.sandbox.tls import SandboxTLS
from stream.sandbox.zookeeper import ZooKeeperEnsemble, ZooKeeperServer
from stream.security.roles import Role

log = get_logger(__name__)

DEFAULT_ROOT = "/streamkeeper"


@dataclass(frozen=True)
class Exited:
    """A sandbox process that exited on its own: what it was, its exit code, its log."""

    name: str
    returncode: int
    log: Path


class SandboxCluster:
    """ZooKeeper and `bookies` bookie processes under `data_dir`. `start()` returns once every
    bookie serves and is registered in ZooKeeper; `stop()` stops them all.

    With `zookeeper` given, the cluster uses that server (and a root of its own) instead of
    starting one, so tests can share one ZooKeeper. With `retention_interval_s`, a retention
    service process (`streamctl retention run`) runs too, once the bookies serve. With
    `metadata_auth_file`, every process authenticates to ZooKeeper as its identity and every
    znode carries its ACL (docs/operations.md, Metadata authentication). With `zookeepers` > 1,
    it starts an ensemble of that many servers on distinct ports."""

    def __init__(
        self,
        data_dir: Path,
        *,
        bookies: int = 3,
        zk_port: int | None = None,
        root: str = DEFAULT_ROOT,
        bookie_settings: dict[str, Any] | None = None,
        zookeeper: ZooKeeperServer | None = None,
        retention_interval_s: float | None = None,
        secure: bool = False,
        metadata_auth_file: Path | None = None,
        zookeepers: int = 1,
        unsafe_skips: Sequence[str] = (),
    ) -> None:
        """`unsafe_skips`: the test-only switches every bookie starts with (`BookieProcess`).
        `secure`: bookies serve mutual TLS with roles; the CA and the certificates (one per
        bookie, one per client role) go to `<data_dir>/tls` (`self.tls`), and unless
        `metadata_auth_file` is given, a new cluster identity goes to
        `<data_dir>/metadata-auth.toml` so that every znode carries ACLs."""
        if bookies < 1:
            raise StreamError("a sandbox needs at least one bookie", bookies=bookies)
        self.data_dir = Path(data_dir)
        self.root = root
        self._own_zookeeper = zookeeper is None
        if zookeepers < 1 or (zookeepers > 1 and (zk_port is not None or zookeeper is not None)):
            raise InvalidArgumentError(
                "an ensemble takes neither a fixed port nor a given server", zookeepers=zookeepers
            )
        self.zookeeper: ZooKeeperServer | ZooKeeperEnsemble = zookeeper or (
            ZooKeeperEnsemble(self.data_dir / "zookeeper", zookeepers)
            if zookeepers > 1
            else ZooKeeperServer(self.data_dir / "zookeeper", port=zk_port)
        )
        if secure and metadata_auth_file is None:
            metadata_auth_file = self.data_dir / "metadata-auth.toml"
            if not metadata_auth_file.exists():
                self.data_dir.mkdir(parents=True, exist_ok=True)
                write_metadata_auth_file(metadata_auth_file)
        self.metadata_auth_file = metadata_auth_file
        # Loaded now: a bad or loose file stops the sandbox before anything starts.
        self._auth: MetadataAuth | None = (
            None if metadata_auth_file is None else load_metadata_auth(metadata_auth_file)
        )
        self.bookie_settings = dict(bookie_settings or {})
        if metadata_auth_file is not None:
            self.bookie_settings.setdefault("metadata_auth_file", str(metadata_auth_file))
        self.bookies: list[BookieProcess] = []
        self.unsafe_skips = tuple(unsafe_skips)
        self._bookie_count = bookies
        self.retention_interval_s = retention_interval_s
        self.retention: RetentionProcess | None = None
        self.tls = SandboxTLS(self.data_dir / "tls") if secure else None

    @property
    def metadata(self) -> str:
        """The connect string `HOST:PORT/ROOT` clients and `streamctl --metadata` use."""
        return self.zookeeper.connect_string(self.root)

    def metadata_options(self) -> list[str]:
        """Returns the `streamctl` global options that reach this sandbox's metadata."""
        options = ["--metadata", self.metadata]
        if self.metadata_auth_file is not None:
            options += ["--metadata-auth-file", str(self.metadata_auth_file)]
        return options

    def start(self, timeout_s: float = 60.0) -> SandboxCluster:
        try:
            if self._own_zookeeper:
                self.zookeeper.start()
            self._ensure_root()
            if self.tls is not None:
                self.tls.create()
            for i in range(1, self._bookie_count + 1):
                self.add_bookie(f"bookie-{i}", wait=False)
            for bookie in self.bookies:
                bookie.wait_ready(timeout_s)
            self.wait_registered(len(self.bookies), timeout_s)
            if self.retention_interval_s is not None:
                self.retention = RetentionProcess(
                    self.metadata,
                    self.data_dir / "retention.log",
                    interval_s=self.retention_interval_s,
                    options=self.streamctl_options(Role.SERVICE),
                    metadata_auth_file=self.metadata_auth_file,
                ).start()
        except BaseException:
            self.stop()
            raise
        log.info("sandbox.started", metadata=self.metadata, bookies=len(self.bookies))
        return self

    def add_bookie(
        self, bookie_id: str, *, wait: bool = True, settings: dict[str, Any] | None = None
    ) -> BookieProcess:
        """Starts one more bookie process and returns it (serving, when `wait`)."""
        tls_settings: dict[str, Any] = {}
        if self.tls is not None:
            tls_settings = self.tls.bookie_settings(bookie_id)
        bookie = BookieProcess(
            bookie_id,
            self.data_dir / bookie_id,
            self.metadata,
            settings={**tls_settings, **self.bookie_settings, **(settings or {})},
            tls=self.tls.client(Role.ADMIN) if self.tls is not None else None,
            unsafe_skips=self.unsafe_skips,
        )
        self.bookies.append(bookie)
        bookie.start()
        if wait:
            bookie.wait_ready()
        return bookie

    def streamctl_options(self, role: Role) -> list[str]:
        """Returns the global streamctl options a client of `role` needs here (the TLS files
        of a secure sandbox; none otherwise)."""
        return self.tls.streamctl_options(role) if self.tls is not None else []

    def bookie(self, bookie_id: str) -> BookieProcess:
        for bookie in self.bookies:
            if bookie.bookie_id == bookie_id:
                return bookie
        raise StreamError("no such sandbox bookie", bookie=bookie_id)

    def registered_bookies(self) -> list[str]:
        """Returns the ids under /bookies/available right now."""
        zk = self._kazoo()
        zk.start(timeout=10)
        try:
            path = f"{self.root}/bookies/available"
            return sorted(zk.get_children(path)) if zk.exists(path) else []
        finally:
            zk.stop()
            zk.close()

    def wait_registered(self, count: int, timeout_s: float = 30.0) -> list[str]:
        """Returns the registered bookie ids once there are exactly `count` of them."""
        deadline = time.monotonic() + timeout_s
        while True:
            ids = self.registered_bookies()
            if len(ids) == count:
                return ids
            if time.monotonic() > deadline:
                raise StreamError("bookies did not register in time", want=count, registered=ids)
            time.sleep(0.05)

    def exited(self) -> list[Exited]:
        """Returns the processes of the sandbox that exited on their own (a ZooKeeper, bookie
        or retention service that died), with their exit codes; the sandbox restarts none."""
        watched: list[tuple[str, subprocess.Popen[bytes] | None, Path]] = [
            (b.bookie_id, b.process, b.log_path) for b in self.bookies
        ]
        if self._own_zookeeper:
            servers = getattr(self.zookeeper, "servers", [self.zookeeper])
            names = (
                ["ZooKeeper"] if len(servers) == 1 else [f"ZooKeeper {s.hosts}" for s in servers]
            )
            watched[:0] = [
                (name, s.process, s.log_path) for name, s in zip(names, servers, strict=True)
            ]
        if self.retention is not None:
            watched.append(("retention service", self.retention.process, self.retention.log_path))
        return [
            Exited(name, process.returncode, log_path)
            for name, process, log_path in watched
            if process is not None and process.poll() is not None
        ]

    def _kazoo(self) -> KazooClient:
        """Returns an unchrooted kazoo client (not started) with the sandbox's identity."""
        return KazooClient(hosts=self.zookeeper.hosts, **kazoo_auth_options(self._auth))

    def zookeeper_quorum(self) -> bool:
        """Whether a majority of the ZooKeeper servers still runs."""
        servers = getattr(self.zookeeper, "servers", [self.zookeeper])
        running = [s for s in servers if s.process is not None and s.process.poll() is None]
        return 2 * len(running) > len(servers)

    def _ensure_root(self) -> None:
        zk = self._kazoo()
        zk.start(timeout=10)
        try:
            zk.ensure_path(self.root)
        finally:
            zk.stop()
            zk.close()

    def stop(self) -> None:
        try:
            try:
                if self.retention is not None:
                    self.retention.stop()
            finally:
                stop_all(self.bookies)
        finally:
            if self._own_zookeeper:
                self.zookeeper.stop()
        log.info("sandbox.stopped", metadata=self.metadata)

    def __enter__(self) -> SandboxCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
