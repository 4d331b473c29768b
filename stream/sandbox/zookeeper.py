"""A standalone ZooKeeper server run from Debian's jars, for the sandbox and the tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import structlog

from stream.errors import StreamError
from stream.sandbox.ports import free_port

log = structlog.get_logger(__name__)

ZOOKEEPER_CLASSPATH = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar"
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"


def four_letter_word(host: str, port: int, word: bytes, timeout_s: float = 1.0) -> bytes:
    """Sends a ZooKeeper four-letter command and returns the whole answer."""
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(word)
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


class ZooKeeperServer:
    """One ZooKeeper process bound to 127.0.0.1 on `port` (a free one when None), with its data
    in `data_dir`. `start()` returns once the server answers `srvr`; `stop()` ends it."""

    def __init__(self, data_dir: Path, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port if port is not None else free_port(host)
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
            "maxSessionTimeout=60000\n"
        )
        return cfg

    def start(self, timeout_s: float = 30.0) -> ZooKeeperServer:
        java = shutil.which("java")
        if java is None or not Path("/usr/share/java/zookeeper.jar").exists():
            raise StreamError(
                "ZooKeeper needs Debian's `zookeeper` package and a JRE: run scripts/setup.sh"
            )
        cfg = self._write_config()
        logfile = open(self.log_path, "ab")  # noqa: SIM115 - owned by Popen
        self.process = subprocess.Popen(
            [java, "-Xmx256m", "-cp", ZOOKEEPER_CLASSPATH, MAIN_CLASS, str(cfg)],
            stdout=logfile,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        logfile.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise StreamError(
                    "ZooKeeper exited at start", log=str(self.data_dir / "zookeeper.log")
                )
            try:
                if four_letter_word(self.host, self.port, b"srvr").startswith(b"Zookeeper"):
                    log.info("zookeeper.started", address=self.hosts, pid=self.process.pid)
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise StreamError("ZooKeeper did not answer in time", address=self.hosts)

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
