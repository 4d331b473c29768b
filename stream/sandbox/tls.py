"""A secure sandbox's certificates: one CA and a certificate per bookie (role `service`: bookies
repair each other) and per client role, all in one directory (`<sandbox>/tls`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream.security.certs import CA_CERT, create_ca, issue
from stream.security.roles import Role
from stream.security.tls import TLSConfig

# The client certificates a secure sandbox issues: principal = role name.
CLIENT_ROLES = (Role.READER, Role.WRITER, Role.SERVICE, Role.ADMIN)


@dataclass(frozen=True)
class SandboxTLS:
    directory: Path

    @property
    def ca_file(self) -> Path:
        return self.directory / CA_CERT

    def create(self) -> SandboxTLS:
        """Makes the CA and a client certificate per role (kept when they exist)."""
        if not self.ca_file.exists():
            create_ca(self.directory, name="streamkeeper-sandbox-ca")
        for role in CLIENT_ROLES:
            self.certificate(role.label, role)
        return self

    def certificate(self, name: str, role: Role) -> TLSConfig:
        """Returns the files of certificate `name`, issued with `role` if it is not there."""
        cert, key = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        if not cert.exists():
            issue(self.directory, name, role)
        return TLSConfig(str(self.ca_file), str(cert), str(key))

    def client(self, role: Role) -> TLSConfig:
        """Returns the files of the client certificate of `role`."""
        return self.certificate(role.label, role)

    def bookie_settings(self, bookie_id: str) -> dict[str, Any]:
        """Returns the bookie.toml keys of a TLS bookie `bookie_id` (its own certificate)."""
        files = self.certificate(bookie_id, Role.SERVICE)
        return {
            "tls_cert_file": files.cert_file,
            "tls_key_file": files.key_file,
            "tls_ca_file": files.ca_file,
        }

    def streamctl_options(self, role: Role) -> list[str]:
        """Returns streamctl's TLS options for a client of `role`."""
        files = self.client(role)
        return [
            "--tls-ca",
            files.ca_file,
            "--tls-cert",
            str(files.cert_file),
            "--tls-key",
            str(files.key_file),
        ]
