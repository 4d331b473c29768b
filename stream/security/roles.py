"""Who may call which bookie RPC (docs/security.md): four roles, each allowed what the one
below it is, plus more. The wire cannot tell a writer's takeover write-back from a service's
re-replication add (both are `AddRequest.recovery`), so recovery adds belong to `writer`."""

from __future__ import annotations

import enum

from stream.errors import InvalidArgumentError

# A certificate carries its role as this SAN URI prefix followed by the role's name.
ROLE_URI_PREFIX = "streamkeeper:role:"


class Role(enum.IntEnum):
    """Ordered: a role may do everything a lower one may."""

    READER = 1
    WRITER = 2
    SERVICE = 3
    ADMIN = 4

    @classmethod
    def parse(cls, name: str) -> Role:
        """Returns the role called `name` (reader, writer, service, admin)."""
        try:
            return cls[name.strip().upper()]
        except KeyError:
            raise InvalidArgumentError(
                "role must be one of " + ", ".join(r.label for r in cls), role=name
            ) from None

    @property
    def label(self) -> str:
        return self.name.lower()

    @property
    def uri(self) -> str:
        return ROLE_URI_PREFIX + self.label


# The least role each RPC needs. A Read with a term (a recovery read) needs `writer`
# (`required_role`).
RPC_ROLES: dict[str, Role] = {
    "Read": Role.READER,
    "ReadRange": Role.READER,
    "ReadLac": Role.READER,
    "StreamState": Role.READER,
    "Info": Role.READER,
    "Add": Role.WRITER,  # recovery adds included (see the module docs)
    "Fence": Role.WRITER,
    "Truncate": Role.WRITER,
    "Trim": Role.SERVICE,
}


def required_role(rpc: str, request: object) -> Role:
    """Returns the least role that may make `request` to `rpc` (admin for an unknown RPC)."""
    if rpc == "Read" and getattr(request, "term", None):
        return Role.WRITER
    return RPC_ROLES.get(rpc, Role.ADMIN)
