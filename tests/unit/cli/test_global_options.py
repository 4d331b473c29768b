"""The options every `streamctl` command takes: `--metadata` (default
`$STREAMKEEPER_METADATA`), `--connect-timeout` and `--output`, before or after the
subcommand; unreachable metadata is one line and exit code 4 once the connect timeout passes."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream.cli.main import build_parser, main
from tests.acl_support import write_auth_file


def _closed_port() -> int:
    """Returns a loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=["refused", "silent"])
def unreachable(request: pytest.FixtureRequest) -> Iterator[str]:
    """Yields the address of a ZooKeeper that refuses connections, or of one that accepts them
    and never answers."""
    if request.param == "refused":
        yield f"127.0.0.1:{_closed_port()}"
        return
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # the kernel completes the handshakes; nobody reads
        yield f"127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.parametrize("command", [["streams"], ["retention", "show", "s"], ["bookies"]])
def test_unreachable_metadata_is_one_line_and_exit_4_after_the_connect_timeout(
    unreachable: str, command: list[str]
) -> None:
    # The wait is bounded by the connect timeout the message names (1.5 s by default), not by
    # kazoo's retries; the subprocess deadline only catches a hang (no timed assertion: the
    # interpreter's start-up alone varies with the machine's load).
    done = subprocess.run(
        [sys.executable, "-m", "stream.cli.main", "--metadata", f"{unreachable}/x", *command],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 4
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "cannot connect to ZooKeeper" in lines[0]
    assert "timeout_s=1.5" in lines[0]


def test_connect_timeout_is_a_global_option(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--metadata", f"127.0.0.1:{_closed_port()}/x", "info", "s",
                 "--connect-timeout", "0.3"])  # fmt: skip
    assert code == 4
    assert "timeout_s=0.3" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["--connect-timeout", "0", "streams"])
    assert refused.value.code == 2


def test_metadata_from_the_environment(
    metadata_root: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STREAMKEEPER_METADATA", metadata_root)
    assert build_parser().parse_args(["streams"]).metadata == metadata_root
    quorum = ["--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1"]
    assert main(["create", "--allow-fewer-bookies", "from-env", *quorum]) == 0
    assert build_parser().parse_args(["--metadata", "h:1/r", "streams"]).metadata == "h:1/r"


def test_global_options_after_the_subcommand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMKEEPER_METADATA", raising=False)
    args = build_parser().parse_args(
        ["retention", "show", "s", "--metadata", "h:1/r", "--connect-timeout", "4",
         "--output", "json"]
    )  # fmt: skip
    assert (args.metadata, args.connect_timeout, args.output) == ("h:1/r", 4.0, "json")
    before = build_parser().parse_args(["--metadata", "h:2/r", "--output", "json", "info", "s"])
    assert (before.metadata, before.output) == ("h:2/r", "json")
    plain = build_parser().parse_args(["info", "s"])
    assert (plain.metadata, plain.connect_timeout, plain.output) == (
        "127.0.0.1:2181/streamkeeper",
        1.5,
        "text",
    )


def test_metadata_auth_file_from_the_option_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("STREAMKEEPER_METADATA_AUTH_FILE", raising=False)
    assert build_parser().parse_args(["streams"]).metadata_auth_file is None
    monkeypatch.setenv("STREAMKEEPER_METADATA_AUTH_FILE", "/env/auth.toml")
    assert build_parser().parse_args(["streams"]).metadata_auth_file == "/env/auth.toml"
    after = build_parser().parse_args(["streams", "--metadata-auth-file", "/opt/a.toml"])
    assert after.metadata_auth_file == "/opt/a.toml"


def test_loose_metadata_auth_file_is_refused_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loose = write_auth_file(tmp_path, mode=0o644)
    code = main(["--metadata", f"127.0.0.1:{_closed_port()}/x", "--metadata-auth-file",
                 str(loose), "streams"])  # fmt: skip
    assert code == 1
    assert "chmod 600" in capsys.readouterr().err


def test_json_refused_where_a_command_has_none(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["--output", "json", "seal", "s"])
    assert refused.value.code == 2
    assert "--output json" in capsys.readouterr().err


def test_services_keep_kazoo_lines() -> None:
    # A service's logs are its output: a ZooKeeper outage must show in them, so only commands
    # that end have kazoo's reconnect lines kept off stderr.
    for argv in (["bookie", "start", "--config", "none.toml"], ["retention", "run"],
                 ["autorecovery", "run"], ["sandbox", "--data-dir", "d"], ["streams"]):  # fmt: skip
        args = build_parser().parse_args(argv)
        assert getattr(args, "service", False) == (argv[0] != "streams")
