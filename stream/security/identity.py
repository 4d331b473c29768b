"""A caller's identity from its certificate: the principal is the subject's common name, the
role the SAN URI `streamkeeper:role:ROLE` (if any). Parsed once per certificate."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from cryptography import x509
from cryptography.x509.oid import NameOID

from stream.errors import InvalidArgumentError
from stream.security.roles import ROLE_URI_PREFIX, Role


@dataclass(frozen=True)
class Identity:
    principal: str
    role: Role | None  # the role the certificate carries, None when it carries none


@functools.lru_cache(maxsize=1024)
def identity_of(pem: bytes) -> Identity:
    """Returns the identity in the PEM certificate `pem` (cached: one parse per certificate,
    not per request)."""
    cert = x509.load_pem_x509_certificate(pem)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    principal = str(names[0].value) if names else cert.subject.rfc4514_string()
    return Identity(principal, _role_in(cert))


def _role_in(cert: x509.Certificate) -> Role | None:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(ROLE_URI_PREFIX):
            try:
                return Role.parse(uri[len(ROLE_URI_PREFIX) :])
            except InvalidArgumentError:
                return None
    return None
