"""Security: TLS material, certificates, identities and roles (docs/security.md)."""

from stream.security.roles import Role, required_role
from stream.security.tls import InsecureFileError, TLSConfig

__all__ = ["InsecureFileError", "Role", "TLSConfig", "required_role"]
