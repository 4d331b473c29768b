"""Certificates for Streamkeeper's mutual TLS, made with the `cryptography` library: one CA per
cluster, and certificates it issues to bookies, clients and services. A certificate names its
principal in the subject's common name and its role in a SAN URI `streamkeeper:role:ROLE`;
every one is good for both sides of a connection (a bookie serves and also calls its peers).
Key files are written readable by their owner only."""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from stream.errors import InvalidArgumentError, StreamError
from stream.security.roles import Role

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Every certificate names these hosts: bookies and sandboxes on one machine.
LOCAL_HOSTS = ("localhost", "127.0.0.1")
DEFAULT_CA_DAYS = 3650
DEFAULT_DAYS = 825


class CertificateError(StreamError):
    """A CA or certificate cannot be made or read (missing CA, existing files, bad name)."""


@dataclass(frozen=True)
class Issued:
    """Where `issue` wrote a certificate and its key."""

    name: str
    role: Role
    cert_file: Path
    key_file: Path
    hosts: tuple[str, ...]
    not_after: datetime.datetime


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Writes `key` as PEM to `path`, created 0600 (never readable by others, not even
    briefly)."""
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _refuse_existing(*paths: Path, force: bool) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing and not force:
        raise CertificateError("files exist (give --force to replace them)", files=existing)


def create_ca(
    directory: Path,
    *,
    name: str = "streamkeeper-ca",
    days: int = DEFAULT_CA_DAYS,
    force: bool = False,
) -> tuple[Path, Path]:
    """Writes a new CA (`ca.crt`, `ca.key`) into `directory`; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    _refuse_existing(cert_path, key_path, force=force)
    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return cert_path, key_path


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except FileNotFoundError as e:
        raise CertificateError(
            "no CA in this directory (run `streamctl certs create-ca` first)", dir=str(directory)
        ) from e
    except ValueError as e:
        raise CertificateError(f"the CA cannot be read: {e}", dir=str(directory)) from e
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertificateError("the CA key is not an EC key", file=str(key_path))
    return cert, key


def _san(hosts: tuple[str, ...], role: Role) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(role.uri)]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def issue(
    directory: Path,
    name: str,
    role: Role,
    *,
    hosts: tuple[str, ...] = (),
    days: int = DEFAULT_DAYS,
    force: bool = False,
) -> Issued:
    """Issues a certificate for principal `name` with `role`, signed by the CA in `directory`,
    and writes `NAME.crt` and `NAME.key` (0600) there. It is good as a server certificate for
    `localhost`, 127.0.0.1 and `hosts`, and as a client certificate."""
    if not _NAME.match(name):
        raise InvalidArgumentError(
            "a certificate name is 1-64 letters, digits, '.', '_' or '-'", name=name
        )
    if days <= 0:
        raise InvalidArgumentError("days must be > 0", days=days)
    ca_cert, ca_key = _load_ca(directory)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    _refuse_existing(cert_path, key_path, force=force)
    all_hosts = tuple(dict.fromkeys((*LOCAL_HOSTS, *hosts)))
    key = _new_key()
    now = _now()
    not_after = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(_san(all_hosts, role), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return Issued(name, role, cert_path, key_path, all_hosts, not_after)
