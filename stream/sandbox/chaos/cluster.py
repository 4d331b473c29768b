"""The chaos cluster: three ZooKeeper servers, bookies and workload processes, each on a host
(network namespace) of its own, on one bridge. The harness itself stays in the root namespace:
it reaches every host and no fault cuts it off."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from stream.errors import StreamError
from stream.logs import get_logger
from stream.metadata.model import RetentionPolicy
from stream.sandbox.bookies import BookieProcess, stop_all
from stream.sandbox.chaos.history import HistoryWriter
from stream.sandbox.chaos.relay import DelayRelays
from stream.sandbox.netns import Host, Network
from stream.sandbox.processes import terminate
from stream.sandbox.retention import RetentionProcess
from stream.sandbox.zookeeper import ZooKeeperEnsemble

log = get_logger(__name__)

ROOT = "/streamkeeper"
BOOKIE_PORT = 3181
STREAM = "chaos"
# One bookie keeps its data on a small tmpfs of its own, which the nemesis fills (a full disk).
SMALL_DISK_BOOKIE = "bookie-2"
SMALL_DISK_SIZE = "256m"
BOOKIES, WRITERS, READERS = 4, 2, 2
# The stream's retention policy, applied by the real retention service on a host of its own:
# fragments (200 entries, a few seconds of appends) go once their last entry is this old, so a
# short run trims several times, overtaking lagging readers and racing the rereads.
RETENTION = RetentionPolicy(max_age_s=15.0)
RETENTION_INTERVAL_S = 3.0


class Worker:
    """A workload process (stream.sandbox.chaos.worker) on its host."""

    def __init__(self, name: str, role: str, host: Host, history: Path, args: list[str]) -> None:
        self.name, self.role, self.host, self.history = name, role, host, history
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, metadata: str, log_dir: Path) -> None:
        with open(log_dir / f"{self.name}.log", "ab") as logfile:
            self.process = self.host.popen(
                [
                    sys.executable,
                    "-m",
                    "stream.sandbox.chaos.worker",
                    self.role,
                    "--metadata",
                    metadata,
                    "--stream",
                    STREAM,
                    "--name",
                    self.name,
                    "--history",
                    str(self.history),
                    *self.args,
                ],  # fmt: skip
                stdout=logfile,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process is not None:
            terminate(self.process, timeout_s)


class ChaosCluster:
    """Builds and tears down the whole cluster under `data_dir`: `bookies` bookies (the last
    one without a journal for entries), three ZooKeeper servers, writers and readers."""

    def __init__(
        self,
        data_dir: Path,
        *,
        bookies: int = BOOKIES,
        writers: int = WRITERS,
        readers: int = READERS,
        seed: int = 0,
        without_protections: tuple[str, ...] = (),
        bookie_settings: dict[str, Any] | None = None,
        delay_relays: bool = False,
        session_timeout_s: float = 10.0,
        unsafe_skips: tuple[str, ...] = (),
    ) -> None:
        """`unsafe_skips`: the test-only switches every bookie starts with (`BookieProcess`)."""
        self.data_dir = Path(data_dir)
        self.network = Network()
        self._bookie_count, self._writers, self._readers = bookies, writers, readers
        self.seed = seed
        self.without_protections = without_protections
        self.bookie_settings = dict(bookie_settings or {})
        self.unsafe_skips = unsafe_skips
        # The workers' ZooKeeper session timeout: how long a writer cut from ZooKeeper lives on.
        self.session_timeout_s = session_timeout_s
        self.zookeeper: ZooKeeperEnsemble | None = None
        self.bookies: list[BookieProcess] = []
        self.bookie_hosts: dict[str, Host] = {}
        self.workers: list[Worker] = []
        self.retention: RetentionProcess | None = None
        self.history_dir = self.data_dir / "history"
        self.harness_history: HistoryWriter | None = None
        self._mounts: list[Path] = []
        # Delay by userspace relays on the server hosts (ZooKeeper, bookies), where the kernel
        # has no `tc netem`.
        self.relays = DelayRelays(self.data_dir / "delay.json") if delay_relays else None

    # ------------------------------------------------------------------ hosts

    @property
    def zookeeper_hosts(self) -> list[Host]:
        return [self.network.host(f"zk{i}") for i in (1, 2, 3)]

    @property
    def metadata(self) -> str:
        if self.zookeeper is None:
            raise StreamError("chaos cluster not started")
        return self.zookeeper.connect_string(ROOT)

    def writer_hosts(self) -> list[Host]:
        return [w.host for w in self.workers if w.role == "writer"]

    # ------------------------------------------------------------------ life

    def start(self) -> ChaosCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.network.start()
        self.history_dir.mkdir(parents=True, exist_ok=True)
        self.harness_history = HistoryWriter(self.history_dir / "harness.jsonl", "harness")
        zk_hosts = [self._add_server_host(f"zk{i}") for i in (1, 2, 3)]
        self.zookeeper = ZooKeeperEnsemble(
            self.data_dir / "zookeeper", 3, hosts=[(h.address, h.command_prefix) for h in zk_hosts]
        ).start()
        zk = KazooClient(hosts=self.zookeeper.hosts)
        zk.start(timeout=30)
        try:
            zk.ensure_path(ROOT)
        finally:
            zk.stop()
            zk.close()
        for i in range(1, self._bookie_count + 1):
            self._add_bookie(f"bookie-{i}", journaled=i < self._bookie_count)
        for bookie in self.bookies:
            bookie.wait_ready(60)
        for i in range(1, self._writers + 1):
            # The first writer takes the stream back at once when superseded (reengage); the
            # others wait a moment and take it over again.
            args = ["--seed", str(self.seed * 100 + i)]
            args += ["--reengage"] if i == 1 else []
            for name in self.without_protections:
                args += ["--without-protection", name]
            self._add_worker(f"writer-{i}", "writer", args)
        for i in range(1, self._readers + 1):
            self._add_worker(f"reader-{i}", "reader", ["--seed", str(self.seed * 100 + 50 + i)])
        self.retention = RetentionProcess(
            self.metadata,
            self.data_dir / "retention.log",
            interval_s=RETENTION_INTERVAL_S,
            command_prefix=self.network.add_host("ret").command_prefix,
        )
        log.info("chaos.cluster_started", metadata=self.metadata, bridge=self.network.bridge)

    def _add_bookie(self, bookie_id: str, *, journaled: bool) -> None:
        host = self._add_server_host(bookie_id.replace("bookie-", "b"))
        if bookie_id == SMALL_DISK_BOOKIE:
            self._mount_small_disk(self.data_dir / bookie_id / "data")
        settings: dict[str, Any] = {
            "journal_write_data": journaled,
            # Auto-recovery acts within the faults' holds: a bookie cut off or killed for a few
            # seconds is counted lost and its fragments are re-replicated meanwhile.
            "lost_bookie_recovery_delay_ms": 2000,
            "audit_interval_ms": 20_000,
            # Plaintext on the harness's private bridge: the bookie refuses a non-loopback
            # address without TLS unless told so.
            "allow_insecure": True,
            **self.bookie_settings,
        }
        bookie = BookieProcess(
            bookie_id,
            self.data_dir / bookie_id,
            self.metadata,
            port=BOOKIE_PORT,
            metrics_port=0,
            settings=settings,
            host=host.address,
            command_prefix=host.command_prefix,
            unsafe_skips=self.unsafe_skips,
        )
        self.bookies.append(bookie)
        self.bookie_hosts[bookie_id] = host
        bookie.start()

    def _add_server_host(self, name: str) -> Host:
        host = self.network.add_host(name)
        if self.relays is not None:
            self.relays.start(host, self.data_dir / f"relay-{name}.log")
        return host

    def _mount_small_disk(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={SMALL_DISK_SIZE}", "tmpfs", str(path)],
            check=True,
            capture_output=True,
        )
        self._mounts.append(path)

    def _add_worker(self, name: str, role: str, args: list[str]) -> None:
        args = [*args, "--session-timeout", str(self.session_timeout_s)]
        host = self.network.add_host(name.replace("writer-", "w").replace("reader-", "r"))
        self.workers.append(Worker(name, role, host, self.history_dir / f"{name}.jsonl", args))

    def start_workers(self) -> None:
        """Starts the workloads and the retention service (the stream must exist)."""
        for worker in self.workers:
            worker.start(self.metadata, self.data_dir)
        if self.retention is not None:
            self.retention.start()

    def stop_workers(self) -> None:
        for worker in self.workers:
            worker.stop()
        if self.retention is not None:
            self.retention.stop()

    def history_files(self) -> list[Path]:
        return sorted(self.history_dir.glob("*.jsonl"))

    def stop(self) -> None:
        """Stops everything and removes the network; never raises (it runs after failures)."""
        for step in (self.stop_workers, lambda: stop_all(self.bookies)):
            try:
                step()
            except Exception as e:
                log.warning("chaos.stop_failed", error=str(e))
        if self.zookeeper is not None:
            self.zookeeper.stop()
        if self.harness_history is not None:
            self.harness_history.close()
        self.network.close()
        for path in self._mounts:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)

    def __enter__(self) -> ChaosCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
