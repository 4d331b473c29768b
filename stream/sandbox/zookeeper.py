"""ZooKeeper run from Debian's jars, for the sandbox and the tests: a standalone server, or an
ensemble of several (each server may run on a host of its own: a network namespace)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stream.errors import StreamError
from stream.logs import get_logger
from stream.sandbox.ports import free_port

log = get_logger(__name__)

ZOOKEEPER_CLASSPATH = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar"
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
# A member of an ensemble runs the quorum peer instead.
QUORUM_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"


def four_letter_word(host: str, port: int, word: bytes, timeout_s: float = 1.0) -> bytes:
    """Sends a ZooKeeper four-letter command and returns the whole answer."""
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(word)
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


@dataclass(frozen=True)
class Peer:
    """One member of an ensemble as the others see it: `server.ID=HOST:QUORUM:ELECTION`."""

    server_id: int
    host: str
    quorum_port: int
    election_port: int

    def config_line(self) -> str:
        return f"server.{self.server_id}={self.host}:{self.quorum_port}:{self.election_port}\n"


class ZooKeeperServer:
    """One ZooKeeper process bound to `host` (127.0.0.1) on `port` (a free one when None), with
    its data in `data_dir`. `start()` returns once the server answers `srvr` (and, in an
    ensemble, serves); `stop()` ends it.

    With `peers` (every member, this one included, as `Peer(server_id, ...)`) it is member
    `server_id` of an ensemble. `command_prefix` goes before the java command (e.g. `ip netns
    exec NS` to run it on a host of its own)."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        server_id: int | None = None,
        peers: Sequence[Peer] = (),
        command_prefix: Sequence[str] = (),
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.server_id = server_id
        self.peers = list(peers)
        self.command_prefix = list(command_prefix)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "zookeeper.log"

    @property
    def hosts(self) -> str:
        return f"{self.host}:{self.port}"

    def connect_string(self, root: str = "/streamkeeper") -> str:
        return f"{self.hosts}{root}"

    def _write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "zoo.cfg"
        cfg.write_text(
            "tickTime=500\n"
            "initLimit=10\n"
            "syncLimit=5\n"
            f"dataDir={self.data_dir / 'data'}\n"
            f"clientPort={self.port}\n"
            f"clientPortAddress={self.host}\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,stat\n"
            "maxClientCnxns=0\n"
            "minSessionTimeout=1000\n"
            "maxSessionTimeout=60000\n" + "".join(peer.config_line() for peer in self.peers)
        )
        if self.peers:
            (self.data_dir / "data").mkdir(exist_ok=True)
            (self.data_dir / "data" / "myid").write_text(f"{self.server_id}\n")
        return cfg

    def start(self, timeout_s: float = 30.0, *, wait: bool = True) -> ZooKeeperServer:
        """Starts the process and, with `wait`, returns once it serves (see `wait_serving`)."""
        java = shutil.which("java")
        if java is None or not Path("/usr/share/java/zookeeper.jar").exists():
            raise StreamError(
                "ZooKeeper needs Debian's `zookeeper` package and a JRE: run scripts/setup.sh"
            )
        cfg = self._write_config()
        logfile = open(self.log_path, "ab")  # noqa: SIM115 - owned by Popen
        main = QUORUM_MAIN_CLASS if self.peers else MAIN_CLASS
        self.process = subprocess.Popen(
            [*self.command_prefix, java, "-Xmx256m", "-cp", ZOOKEEPER_CLASSPATH, main, str(cfg)],
            stdout=logfile,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        logfile.close()
        if wait:
            try:
                self.wait_serving(timeout_s)
            except StreamError:
                self.stop()
                raise
        return self

    def mode(self) -> str | None:
        """Returns the server's `Mode:` (standalone, leader, follower) while it serves; None
        when it does not answer or does not serve (an ensemble member without a quorum)."""
        try:
            answer = four_letter_word(self.host, self.port, b"srvr").decode(errors="replace")
        except OSError:
            return None
        for line in answer.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def wait_serving(self, timeout_s: float = 30.0) -> None:
        """Returns once the server serves; raises StreamError if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise StreamError("ZooKeeper exited at start", log=str(self.log_path))
            if self.mode() is not None:
                log.info("zookeeper.started", address=self.hosts, pid=self.process.pid)
                return
            time.sleep(0.1)
        raise StreamError("ZooKeeper did not answer in time", address=self.hosts)

    def kill9(self) -> None:
        """Kills the server with SIGKILL (a crash) and reaps it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
            log.info("zookeeper.killed", address=self.hosts)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        log.info("zookeeper.stopped", address=self.hosts)
        self.process = None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ZooKeeperEnsemble:
    """`servers` ZooKeeper servers forming one ensemble: on 127.0.0.1 with distinct ports, or
    each on a host of `hosts` (address and command prefix, e.g. network namespaces) on the
    standard ports. `hosts` (the property) is the multi-host connect string."""

    def __init__(
        self,
        data_dir: Path,
        servers: int = 3,
        *,
        hosts: Sequence[tuple[str, Sequence[str]]] = (),
    ) -> None:
        if servers < 1 or (hosts and len(hosts) != servers):
            raise StreamError("an ensemble needs one host per server", servers=servers)
        self.data_dir = Path(data_dir)
        places = list(hosts) or [("127.0.0.1", ())] * servers
        ports = [
            (2181, 2888, 3888) if hosts else (free_port(), free_port(), free_port()) for _ in places
        ]
        peers = [
            Peer(i + 1, address, quorum, election)
            for i, ((address, _), (_, quorum, election)) in enumerate(
                zip(places, ports, strict=True)
            )
        ]
        self.servers = [
            ZooKeeperServer(
                self.data_dir / f"zookeeper-{i + 1}",
                port=client_port,
                host=address,
                server_id=i + 1,
                peers=peers if servers > 1 else (),
                command_prefix=prefix,
            )
            for i, ((address, prefix), (client_port, _, _)) in enumerate(
                zip(places, ports, strict=True)
            )
        ]

    @property
    def hosts(self) -> str:
        return ",".join(server.hosts for server in self.servers)

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The first server's process (what a single-server sandbox watches)."""
        return self.servers[0].process

    @property
    def log_path(self) -> Path:
        return self.servers[0].log_path

    def connect_string(self, root: str = "/streamkeeper") -> str:
        return f"{self.hosts}{root}"

    def start(self, timeout_s: float = 60.0) -> ZooKeeperEnsemble:
        """Starts every server and returns once each serves (a leader was elected)."""
        try:
            for server in self.servers:
                server.start(wait=False)
            for server in self.servers:
                server.wait_serving(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def leader(self) -> ZooKeeperServer | None:
        """Returns the server that says it leads (the only one when standalone), if any."""
        for server in self.servers:
            if server.mode() in ("leader", "standalone"):
                return server
        return None

    def stop(self) -> None:
        for server in self.servers:
            try:
                server.stop()
            except Exception as e:  # stop the others all the same
                log.warning("zookeeper.stop_failed", address=server.hosts, error=str(e))

    def __enter__(self) -> ZooKeeperEnsemble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
