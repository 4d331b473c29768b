"""The retention service as a real subprocess (`streamctl retention run`), for the sandbox and
the integration tests."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from stream.errors import StreamError
from stream.logs import get_logger
from stream.sandbox.processes import terminate

log = get_logger(__name__)


class RetentionProcess:
    """One `streamctl --metadata METADATA retention run` subprocess logging (JSON lines) to
    `log_path`. `start()` does not wait for leadership: several may run, one leads."""

    def __init__(
        self,
        metadata: str,
        log_path: Path,
        *,
        interval_s: float = 60.0,
        instance_id: str = "retention-1",
        session_timeout_s: float = 4.0,
        metrics_listen: str = "",
        options: list[str] | None = None,
        metadata_auth_file: Path | None = None,
        command_prefix: list[str] | None = None,
    ) -> None:
        """`metrics_listen` ("HOST:PORT"): serve Prometheus metrics there (each durable
        cursor's lag); empty: no endpoint. `options`: more global streamctl options (the TLS
        files of a secure sandbox). `command_prefix` goes before the command (e.g. `ip netns
        exec NS`: the chaos harness runs it on a host of its own)."""
        self.options = list(options or [])
        self.command_prefix = list(command_prefix or [])
        self.metadata = metadata
        self.metadata_auth_file = metadata_auth_file
        self.log_path = Path(log_path)
        self.interval_s = interval_s
        self.instance_id = instance_id
        self.session_timeout_s = session_timeout_s
        self.metrics_listen = metrics_listen
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        """Returns whether the process runs now."""
        return self.process is not None and self.process.poll() is None

    def _auth_arguments(self) -> list[str]:
        if self.metadata_auth_file is None:
            return []
        return ["--metadata-auth-file", str(self.metadata_auth_file)]

    def start(self) -> RetentionProcess:
        """Starts the process (returns at once)."""
        if self.running:
            raise StreamError("retention service already running", id=self.instance_id)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logfile:
            self.process = subprocess.Popen(
                [
                    *self.command_prefix,
                    sys.executable,
                    "-m",
                    "stream.cli.main",
                    "--log-json",  # the log file is read back as JSON lines
                    "--metadata",
                    self.metadata,
                    *self.options,
                    *self._auth_arguments(),
                    "retention",
                    "run",
                    "--interval",
                    f"{self.interval_s}s",
                    "--session-timeout",
                    f"{self.session_timeout_s}s",
                    "--id",
                    self.instance_id,
                    *(("--metrics-listen", self.metrics_listen) if self.metrics_listen else ()),
                ],
                stdout=logfile,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C on the terminal must not reach it
            )
        log.info("retention_process.started", id=self.instance_id, pid=self.process.pid)
        return self

    def log_text(self) -> str:
        """Returns the process's log so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def kill9(self) -> None:
        """Kills the process with SIGKILL (its ZooKeeper session lingers until it times out)."""
        if self.running and self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """Stops the process (SIGTERM: it hands leadership over at once; SIGKILL after
        `timeout_s`) and returns its exit code, None when it never started."""
        if self.process is None:
            return None
        if terminate(self.process, timeout_s):
            log.error("retention_process.sigterm_timeout", id=self.instance_id)
        return self.process.returncode

    def wait_logged(self, event: str, timeout_s: float = 30.0) -> None:
        """Returns once the log holds `event` (a structlog event name); raises StreamError
        with the log's tail when the process exits or `timeout_s` passes first."""
        deadline = time.monotonic() + timeout_s
        while f'"{event}"' not in self.log_text():
            if not self.running or time.monotonic() > deadline:
                tail = "\n".join(self.log_text().splitlines()[-20:])
                raise StreamError(f"retention service did not log {event}:\n{tail}")
            time.sleep(0.05)
