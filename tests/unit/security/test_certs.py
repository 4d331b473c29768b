"""`streamctl certs create-ca|issue`: files, permissions, the principal and role they carry,
and bad input refused with nothing written."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from cryptography import x509

from stream.cli.main import main
from stream.security.identity import identity_of
from stream.security.roles import Role


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_create_ca_and_issue_write_owner_only_keys_and_the_role(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["certs", "create-ca", "--dir", str(tmp_path)]) == 0
    capsys.readouterr()
    code = main(
        [
            "--output",
            "json",
            "certs",
            "issue",
            "app-1",
            "--role",
            "writer",
            "--dir",
            str(tmp_path),
            "--host",
            "bookie.example",
            "--host",
            "10.0.0.7",
        ]
    )
    assert code == 0
    issued = json.loads(capsys.readouterr().out)
    assert issued["role"] == "writer" and issued["name"] == "app-1"
    assert mode(tmp_path / "ca.key") == 0o600 and mode(tmp_path / "app-1.key") == 0o600
    pem = (tmp_path / "app-1.crt").read_bytes()
    identity = identity_of(pem)
    assert identity.principal == "app-1" and identity.role is Role.WRITER
    san = (
        x509.load_pem_x509_certificate(pem)
        .extensions.get_extension_for_class(x509.SubjectAlternativeName)
        .value
    )
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["streamkeeper:role:writer"]
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "bookie.example"}
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.0.0.7"}


def test_issue_refuses_bad_input_and_existing_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["certs", "issue", "x", "--role", "reader", "--dir", str(tmp_path)]) == 1
    assert "no CA" in capsys.readouterr().err
    assert main(["certs", "create-ca", "--dir", str(tmp_path)]) == 0
    assert main(["certs", "create-ca", "--dir", str(tmp_path)]) == 1
    assert "--force" in capsys.readouterr().err
    assert main(["certs", "issue", "../evil", "--role", "reader", "--dir", str(tmp_path)]) == 2
    with pytest.raises(SystemExit):
        main(["certs", "issue", "x", "--role", "root", "--dir", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "ca.key"]
