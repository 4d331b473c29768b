"""TLS material from files, for gRPC channels and the data port's connections (`TLSConfig`)
and for a bookie's ports (`ServerCredentials`, re-read on SIGHUP without restarting the
servers). A key file readable by group or others, or a certificate writable by them, is
refused."""

from __future__ import annotations

import os
import ssl
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stream.errors import ConfigError
from stream.logs import get_logger

if TYPE_CHECKING:
    # Imported where a gRPC channel or server is made: the options of a Spark query name
    # TLS files, and its source runner may read over the data ports only (~27 ms of import).
    import grpc

log = get_logger(__name__)


class InsecureFileError(ConfigError):
    """A key file others may read, or a certificate others may replace: refused."""


def read_protected(path: str | Path, *, key: bool, name: str) -> bytes:
    """Returns the bytes of `path`; refuses a key (`key`) that group or others may read or
    write, and a certificate they may write. `name` is the option or config key given."""
    try:
        st = os.stat(path)
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {name}: {e.strerror}", key=name, path=str(path)) from e
    loose = st.st_mode & (0o077 if key else 0o022)
    if loose:
        what = "readable or writable by group or others" if key else "writable by group or others"
        fix = "0600" if key else "0644"
        raise InsecureFileError(
            f"{name} is {what} (mode {stat.filemode(st.st_mode)}); chmod {fix} it",
            key=name,
            path=str(path),
        )
    return data


@dataclass(frozen=True)
class TLSMaterial:
    """What the files of a `TLSConfig` hold (PEM)."""

    ca: bytes
    cert: bytes | None
    key: bytes | None


@dataclass(frozen=True)
class TLSConfig:
    """Where a client's TLS files are: the CA that signed the bookies' certificates, and this
    client's certificate and key (needed by bookies that require client certificates, the
    default)."""

    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigError(
                "a TLS certificate needs its key, and a key its certificate",
                cert_file=self.cert_file,
                key_file=self.key_file,
            )

    def load(self) -> TLSMaterial:
        """Reads the files (refusing loose permissions)."""
        ca = read_protected(self.ca_file, key=False, name="tls_ca_file")
        cert = key = None
        if self.cert_file is not None and self.key_file is not None:
            cert = read_protected(self.cert_file, key=False, name="tls_cert_file")
            key = read_protected(self.key_file, key=True, name="tls_key_file")
        return TLSMaterial(ca, cert, key)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Returns credentials for a channel to a bookie (files read now)."""
        import grpc

        material = self.load()
        return grpc.ssl_channel_credentials(
            root_certificates=material.ca,
            private_key=material.key,
            certificate_chain=material.cert,
        )

    def client_context(self) -> ssl.SSLContext:
        """Returns a TLS context for a connection to a bookie's data port (files read now):
        the bookie's certificate checked against the CA and the address, as gRPC does."""
        material = self.load()
        context = ssl.create_default_context(cadata=material.ca.decode("ascii", "replace"))
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file is not None and self.key_file is not None:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


def _server_context(
    files: TLSConfig, material: TLSMaterial, require_client_auth: bool
) -> ssl.SSLContext:
    """Returns a data port's TLS context for `files` (their `material` already read, with
    their permissions checked)."""
    assert files.cert_file is not None and files.key_file is not None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert_file, files.key_file)
        context.load_verify_locations(cadata=material.ca.decode("ascii", "replace"))
    except (ssl.SSLError, OSError, ValueError) as e:
        raise ConfigError(f"unusable TLS files: {e}", cert_file=files.cert_file) from e
    context.verify_mode = ssl.CERT_REQUIRED if require_client_auth else ssl.CERT_NONE
    return context


class ServerCredentials:
    """A bookie's TLS: `credentials` go to `add_secure_port`, `ssl_context` to the data port's
    listener; `reload()` re-reads the files, and the next TLS handshake of either port uses
    them (connections already open keep theirs, so no stream is dropped). A reload that fails
    keeps the previous files in use."""

    def __init__(self, files: TLSConfig, *, require_client_auth: bool) -> None:
        if files.cert_file is None or files.key_file is None:
            raise ConfigError("a TLS bookie needs tls_cert_file and tls_key_file")
        import grpc

        self._files = files
        self._require_client_auth = require_client_auth
        self._lock = threading.Lock()
        self._pending: grpc.ServerCertificateConfiguration | None = None
        material = files.load()
        # The listener's context, current until a reload: each handshake switches to the
        # current one (the callback runs for every ClientHello, with or without a server name).
        self.ssl_context = self._current = _server_context(files, material, require_client_auth)
        self.ssl_context.sni_callback = self._switch_context
        self.credentials = grpc.dynamic_ssl_server_credentials(
            self._configuration(material),
            # grpc-stubs types the fetcher as never returning None, but gRPC documents None as
            # "keep the configuration in use", which `_fetch` relies on.
            self._fetch,  # type: ignore[arg-type]
            require_client_authentication=require_client_auth,
        )

    def _configuration(self, material: TLSMaterial) -> grpc.ServerCertificateConfiguration:
        import grpc

        assert material.key is not None and material.cert is not None
        return grpc.ssl_server_certificate_configuration(
            [(material.key, material.cert)], root_certificates=material.ca
        )

    def _switch_context(self, connection: ssl.SSLObject, name: str | None, _: object) -> None:
        connection.context = self._current

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC before each handshake: None keeps the configuration in use.
        with self._lock:
            pending, self._pending = self._pending, None
        return pending

    def reload(self) -> bool:
        """Re-reads the certificate, key and CA files; returns whether they were taken."""
        try:
            material = self._files.load()
            configuration = self._configuration(material)
            context = _server_context(self._files, material, self._require_client_auth)
        except ConfigError as e:
            log.error("tls.reload_failed", error=str(e))
            return False
        with self._lock:
            self._pending = configuration
        self._current = context
        log.info("tls.reloaded", cert_file=self._files.cert_file, ca_file=self._files.ca_file)
        return True


def aio_channel(
    address: str, tls: TLSConfig | None, options: Sequence[tuple[str, object]] | None = None
) -> grpc.aio.Channel:
    """Returns a grpc.aio channel to `address`: TLS with `tls`'s files, plaintext without."""
    import grpc

    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, tls.channel_credentials(), options=options)


def sync_channel(
    address: str, tls: TLSConfig | None, options: Sequence[tuple[str, object]] | None = None
) -> grpc.Channel:
    """As `aio_channel`, for blocking callers (streamctl's one-shot requests)."""
    import grpc

    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.channel_credentials(), options=options)
