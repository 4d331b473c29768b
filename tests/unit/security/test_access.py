"""Roles per RPC, the security keys of bookie.toml and the refusal of a plaintext bookie
beyond loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stream.bookie.access import refuse_insecure_listen
from stream.bookie.config import BookieConfig
from stream.errors import ConfigError
from stream.security.roles import Role, required_role
from stream.security.tls import InsecureFileError, TLSConfig
from stream.wire import bookie_pb2 as pb

REQUIRED = {"bookie_id": "b1", "listen": "127.0.0.1:3181", "metadata": "127.0.0.1:2181/sk"}


def config(**overrides: Any) -> BookieConfig:
    return BookieConfig.from_dict({**REQUIRED, **overrides})


def test_each_rpc_needs_its_role() -> None:
    needs = {
        rpc: required_role(rpc, request)
        for rpc, request in (
            ("Info", pb.InfoRequest()),
            ("StreamState", pb.StreamStateRequest()),
            ("ReadRange", pb.ReadRangeRequest()),
            ("ReadLac", pb.ReadLacRequest()),
            ("Read", pb.ReadRequest(term=0)),
            ("Add", None),
            ("Fence", pb.FenceRequest()),
            ("Truncate", pb.TruncateRequest()),
            ("Trim", pb.TrimRequest()),
        )
    }
    assert {rpc for rpc, role in needs.items() if role is Role.READER} == {
        "Info",
        "StreamState",
        "ReadRange",
        "ReadLac",
        "Read",
    }
    assert {rpc for rpc, role in needs.items() if role is Role.WRITER} == {
        "Add",
        "Fence",
        "Truncate",
    }
    assert needs["Trim"] is Role.SERVICE
    assert required_role("Read", pb.ReadRequest(term=3)) is Role.WRITER
    assert required_role("SomethingNew", None) is Role.ADMIN


def test_security_keys_are_checked() -> None:
    c = config(
        tls_cert_file="b.crt", tls_key_file="b.key", tls_ca_file="ca.crt", roles={"ops": "admin"}
    )
    assert c.tls and c.tls_client_auth == "require" and c.roles == {"ops": "admin"}
    with pytest.raises(ConfigError, match="tls_ca_file is missing"):
        config(tls_cert_file="b.crt", tls_key_file="b.key")
    with pytest.raises(ConfigError, match="tls_client_auth"):
        config(tls_client_auth="optional")
    with pytest.raises(ConfigError, match="roles.ops"):
        config(roles={"ops": "root"})
    with pytest.raises(ConfigError, match="roles"):
        config(roles={"ops": 3})


def test_roles_round_trip_through_toml(tmp_path: Path) -> None:
    c = config(roles={"app-1": "writer", "ops team": "admin"})
    path = tmp_path / "bookie.toml"
    path.write_text(c.to_toml())
    assert BookieConfig.load(path) == c


def test_plaintext_beyond_loopback_needs_allow_insecure() -> None:
    refuse_insecure_listen(config(listen="127.0.0.1:3181"))
    refuse_insecure_listen(config(listen="localhost:3181"))
    refuse_insecure_listen(config(listen="[::1]:3181"))
    with pytest.raises(ConfigError, match="allow_insecure"):
        refuse_insecure_listen(config(listen="0.0.0.0:3181"))
    refuse_insecure_listen(config(listen="0.0.0.0:3181", allow_insecure=True))
    refuse_insecure_listen(
        config(listen="0.0.0.0:3181", tls_cert_file="c", tls_key_file="k", tls_ca_file="a")
    )


def test_a_plaintext_data_port_beyond_loopback_needs_allow_insecure() -> None:
    refuse_insecure_listen(config(listen="127.0.0.1:3181", data_listen="127.0.0.1:3182"))
    refuse_insecure_listen(config(listen="127.0.0.1:3181", data_listen=""))
    with pytest.raises(ConfigError, match="data_listen 0.0.0.0 is not a loopback"):
        refuse_insecure_listen(config(listen="127.0.0.1:3181", data_listen="0.0.0.0:3182"))
    refuse_insecure_listen(
        config(listen="127.0.0.1:3181", data_listen="0.0.0.0:3182", allow_insecure=True)
    )


def test_loose_files_are_refused(tmp_path: Path) -> None:
    for name in ("ca.crt", "c.crt", "c.key"):
        (tmp_path / name).write_text("x")
        (tmp_path / name).chmod(0o600)
    files = TLSConfig(str(tmp_path / "ca.crt"), str(tmp_path / "c.crt"), str(tmp_path / "c.key"))
    assert files.load().key == b"x"
    (tmp_path / "c.key").chmod(0o640)
    with pytest.raises(InsecureFileError, match="tls_key_file"):
        files.load()
    (tmp_path / "c.key").chmod(0o600)
    (tmp_path / "c.crt").chmod(0o666)
    with pytest.raises(InsecureFileError, match="tls_cert_file"):
        files.load()
    with pytest.raises(ConfigError, match="needs its key"):
        TLSConfig("ca.crt", "c.crt")
