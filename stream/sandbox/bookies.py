"""Bookies as real subprocesses (`streamctl bookie start`), for the sandbox, the integration
tests and the benchmarks."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from stream.bookie.unsafe import UNSAFE_SKIP_OPTION
from stream.errors import StreamError
from stream.logs import get_logger
from stream.sandbox.ports import free_port
from stream.sandbox.processes import terminate
from stream.security.tls import TLSConfig, sync_channel
from stream.wire import bookie_pb2 as pb
from stream.wire import bookie_pb2_grpc

log = get_logger(__name__)

# Client channel options: reconnect quickly after a bookie restart, carry large batches.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class BookieProcess:
    """One bookie subprocess with its own `bookie.toml` in `data_dir` (which also holds the
    data and `bookie.log`). The listen, data and metrics ports are chosen once and kept across
    restarts (the address is part of the bookie's cookie; writers reconnect to the same data
    port). `settings` override or add keys of
    the config file verbatim, unchecked, so a test can also write an invalid one. `host` is the
    address it listens on; `command_prefix` goes before its command (e.g. `ip netns exec NS` to
    run it on a host of its own). `unsafe_skips` names the test-only switches
    (`stream.bookie.unsafe`) it starts with (none by default; a change applies at the next
    start)."""

    def __init__(
        self,
        bookie_id: str,
        data_dir: Path,
        metadata: str,
        *,
        port: int | None = None,
        metrics_port: int | None = None,
        settings: dict[str, Any] | None = None,
        tls: TLSConfig | None = None,
        host: str = "127.0.0.1",
        command_prefix: list[str] | None = None,
        unsafe_skips: Sequence[str] = (),
    ) -> None:
        """`tls`: the client files `stub()` reaches a TLS bookie with."""
        self.tls = tls
        self.unsafe_skips = tuple(unsafe_skips)
        self.bookie_id = bookie_id
        self.host = host
        self.command_prefix = list(command_prefix or [])
        self.data_dir = Path(data_dir)
        self.metadata = metadata
        self.port = port if port is not None else free_port()
        # 0: no metrics endpoint.
        self.metrics_port = metrics_port if metrics_port is not None else free_port()
        # The data port is on in the sandbox (off by default in a bookie.toml).
        self.data_port = free_port()
        self.settings: dict[str, Any] = dict(settings or {})
        self.config_path = self.data_dir / "bookie.toml"
        self.log_path = self.data_dir / "bookie.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._channel: grpc.Channel | None = None
        self._stub: bookie_pb2_grpc.BookieStub | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def metrics_address(self) -> str:
        return f"{self.host}:{self.metrics_port}" if self.metrics_port else ""

    @property
    def pid(self) -> int:
        if self.process is None:
            raise StreamError("bookie process not started", bookie=self.bookie_id)
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def config_values(self) -> dict[str, Any]:
        """Returns every key written to bookie.toml."""
        values: dict[str, Any] = {
            "bookie_id": self.bookie_id,
            "listen": self.address,
            "data_listen": f"{self.host}:{self.data_port}",
            "metadata": self.metadata,
            "data_dir": str(self.data_dir / "data"),
            "metrics_listen": self.metrics_address,
            # Short sessions: a killed bookie's registration goes quickly.
            "metadata_session_timeout_ms": 4000,
            "log_level": "info",
        }
        values.update(self.settings)
        return values

    def write_config(self) -> Path:
        """Writes bookie.toml from `config_values()` and returns its path."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        values = self.config_values()
        text = "".join(
            f"{k} = {_toml_value(v)}\n" for k, v in values.items() if not isinstance(v, dict)
        )
        for name, table in values.items():  # tables ([roles]) after every plain key
            if isinstance(table, dict):
                text += f"[{name}]\n"
                text += "".join(f"{_toml_value(k)} = {_toml_value(v)}\n" for k, v in table.items())
        self.config_path.write_text(text)
        return self.config_path

    def start(self) -> BookieProcess:
        """Writes the config and starts the process (does not wait: see `wait_ready`)."""
        if self.running:
            raise StreamError("bookie already running", bookie=self.bookie_id, pid=self.pid)
        self.write_config()
        unsafe = [UNSAFE_SKIP_OPTION, ",".join(self.unsafe_skips)] if self.unsafe_skips else []
        with open(self.log_path, "ab") as logfile:
            logfile.write(f"--- start {time.strftime('%H:%M:%S')} ---\n".encode())
            logfile.flush()
            self.process = subprocess.Popen(
                [
                    *self.command_prefix,
                    sys.executable,
                    "-m",
                    "stream.cli.main",
                    "--log-json",  # the log file is read back as JSON lines
                    "bookie",
                    "start",
                    "--config",
                    str(self.config_path),
                    *unsafe,
                ],
                stdout=logfile,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C on the terminal must not reach it
            )
        log.info("bookie_process.started", bookie=self.bookie_id, pid=self.process.pid)
        return self

    def log_tail(self, lines: int = 30) -> str:
        """Returns the last `lines` lines of the bookie's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stub(self) -> bookie_pb2_grpc.BookieStub:
        """Returns a BookieStub on a channel to this bookie (one channel, kept across
        restarts)."""
        if self._stub is None:
            self._channel = sync_channel(self.address, self.tls, CHANNEL_OPTIONS)
            self._stub = bookie_pb2_grpc.BookieStub(self._channel)
        return self._stub

    @property
    def channel(self) -> grpc.Channel:
        """Returns the channel under `stub()` (for generic calls in tests)."""
        self.stub()
        if self._channel is None:
            raise StreamError("channel closed", bookie=self.bookie_id)
        return self._channel

    def wait_ready(self, timeout_s: float = 30.0) -> pb.InfoResponse:
        """Returns the bookie's Info once it answers; raises StreamError with the log tail if
        the process exits or does not answer within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        stub = self.stub()
        last_error = ""
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise StreamError(
                    f"bookie exited before serving (exit code {code}):\n{self.log_tail()}",
                    bookie=self.bookie_id,
                )
            try:
                info: pb.InfoResponse = stub.Info(pb.InfoRequest(), timeout=1.0)
                return info
            except grpc.RpcError as e:
                last_error = f"{e.code().name}: {e.details()}"
            time.sleep(0.05)
        raise StreamError(
            f"bookie did not answer within {timeout_s}s ({last_error}):\n{self.log_tail()}",
            bookie=self.bookie_id,
        )

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        """Returns the process's exit code once it exits; raises StreamError after
        `timeout_s`."""
        if self.process is None:
            raise StreamError("bookie process not started", bookie=self.bookie_id)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise StreamError(
                f"bookie still running after {timeout_s}s", bookie=self.bookie_id
            ) from None

    def kill9(self) -> None:
        """Kills the process with SIGKILL (a crash: nothing is flushed) and reaps it."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            log.info("bookie_process.killed", bookie=self.bookie_id)

    def terminate(self, timeout_s: float = 30.0) -> int | None:
        """Sends SIGTERM (a clean shutdown) and returns the exit code; SIGKILL after
        `timeout_s`. None when the process was not running."""
        if self.process is None:
            return None
        if terminate(self.process, timeout_s):
            log.error("bookie_process.sigterm_timeout", bookie=self.bookie_id)
        return self.process.returncode

    def restart(self, *, clean: bool = True, wait: bool = True) -> BookieProcess:
        """Stops the bookie (SIGTERM when `clean`, else SIGKILL), starts it again and, with
        `wait`, returns once it serves."""
        if clean:
            self.terminate()
        else:
            self.kill9()
        self.start()
        if wait:
            self.wait_ready()
        return self

    def close(self) -> None:
        """Stops the process (SIGTERM, then SIGKILL) and closes the channel."""
        try:
            self.terminate(timeout_s=15.0)
        finally:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
                self._stub = None

    def __enter__(self) -> BookieProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stop_all(bookies: list[BookieProcess]) -> None:
    """Stops every bookie in `bookies`, even when some fail to stop."""
    errors = []
    for bookie in bookies:
        try:
            bookie.close()
        except Exception as e:  # keep stopping the others
            errors.append(e)
    if errors:
        raise errors[0]


__all__ = ["CHANNEL_OPTIONS", "BookieProcess", "stop_all"]
