"""Who may call the bookie, and the audit of what they did (docs/security.md).

One gRPC server interceptor sees every call (and the data port asks `AccessControl.admit` of
every Add stream it opens): with mutual TLS (`tls_client_auth = "require"`)
it takes the caller's principal from its certificate (the subject's common name) and its role
from `[roles]` or the certificate's SAN URI, and refuses a call beyond that role with
PERMISSION_DENIED before the handler runs (nothing changes). On a plaintext port, or with
`tls_client_auth = "none"`, there is no principal and no role applies. Either way, every Fence,
Truncate, Trim, recovery add and refusal is logged (one `bookie.audit` event each, with the
principal and the peer's address) and counted per principal."""

from __future__ import annotations

import contextvars
import functools
import ipaddress
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import grpc

from stream.bookie import metrics
from stream.bookie.config import BookieConfig
from stream.bookie.storage.scanned import AddRequest, entry_ids
from stream.errors import ConfigError
from stream.logs import get_logger
from stream.security.identity import identity_of
from stream.security.roles import Role, required_role

log = get_logger(__name__)

# The bookie's handlers take requests of several types: the context is typed for none of them.
# A string: grpc's runtime classes are not subscriptable (only its stubs are generic).
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")

# The principal of a caller without a certificate (plaintext, or TLS without client auth).
ANONYMOUS = "anonymous"
_AUDITED_RPCS = frozenset({"Fence", "Truncate", "Trim"})


@dataclass(frozen=True)
class Caller:
    principal: str
    peer: str
    role: Role | None  # None: no role (refused everything when roles are enforced)


# The caller of the RPC being served: the Add handler reads it to audit a recovery add (the
# interceptor sees the stream, not its messages).
CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("caller", default=None)


def audit(action: str, caller: Caller | None, **fields: Any) -> None:
    """Logs one audit event (`action`: the RPC, `recovery_add` or `refused`) and counts it for
    the caller's principal."""
    principal = caller.principal if caller else ANONYMOUS
    metrics.AUDIT_EVENTS.labels(action=action, principal=principal).inc()
    # Refusals are warnings; the rest is the record of who changed what.
    emit = log.warning if action == "refused" else log.info
    emit(
        "bookie.audit",
        action=action,
        principal=principal,
        peer=caller.peer if caller else "",
        role=caller.role.label if caller and caller.role else None,
        **fields,
    )


def audit_recovery_add(request: AddRequest) -> None:
    """Audits one recovery add batch (called by the Add handler, in the caller's context)."""
    ids = entry_ids(request)
    audit(
        "recovery_add",
        CALLER.get(),
        stream_id=request.stream_id,
        term=request.term,
        first_entry_id=ids[0] if ids else None,
        entries=len(ids),
    )


def _fields(request: Any) -> dict[str, Any]:
    """The request's fields worth an audit line (ids and terms, never payloads)."""
    names = ("stream_id", "term", "entry_id", "after_entry_id", "before_entry_id")
    return {name: getattr(request, name) for name in names if hasattr(request, name)}


class AccessControl(grpc.aio.ServerInterceptor):
    """The bookie's interceptor; `enforce` when callers carry certificates (mutual TLS)."""

    def __init__(self, config: BookieConfig) -> None:
        self.enforce = config.tls and config.tls_client_auth == "require"
        self._roles = {principal: Role.parse(role) for principal, role in config.roles.items()}

    def caller(self, context: Context) -> Caller:
        """Returns who makes the call of `context`."""
        pems = (context.auth_context() or {}).get("x509_pem_cert", ()) if self.enforce else ()
        return self.caller_of(next(iter(pems), None), context.peer())

    def caller_of(self, pem: bytes | None, peer: str) -> Caller:
        """Returns who calls from `peer` with the PEM certificate `pem` (None: no
        certificate; ignored unless roles are enforced)."""
        if pem is None or not self.enforce:
            return Caller(ANONYMOUS, peer, None)
        identity = identity_of(pem)
        role = self._roles.get(identity.principal, identity.role)
        return Caller(identity.principal, peer, role)

    def admit(self, rpc: str, request: Any, caller: Caller) -> str | None:
        """Returns None when `caller` may make `request` to `rpc` (auditing it when audited);
        otherwise audits the refusal and returns why it is refused. For every transport: the
        gRPC calls and the data port's Add streams."""
        fields = _fields(request) if request is not None else {}
        if self.enforce:
            need = required_role(rpc, request)
            if caller.role is None or caller.role < need:
                audit("refused", caller, rpc=rpc, needs=need.label, **fields)
                has = caller.role.label if caller.role else "no role"
                return (
                    f"{rpc} refused: principal {caller.principal!r} ({has}) is not "
                    f"allowed it; it needs the role {need.label}"
                )
        if rpc in _AUDITED_RPCS:
            audit(rpc, caller, **fields)
        return None

    async def _admit(self, rpc: str, request: Any, context: Context) -> Caller:
        """Returns the caller when it may make `request`; otherwise aborts the call with
        PERMISSION_DENIED (`admit` audited the refusal)."""
        caller = self.caller(context)
        CALLER.set(caller)
        refusal = self.admit(rpc, request, caller)
        if refusal is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
        return caller

    def _unary(self, rpc: str, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        async def guarded(request: Any, context: Context) -> Any:
            await self._admit(rpc, request, context)
            return await behavior(request, context)

        return guarded

    def _streaming(
        self, rpc: str, behavior: Callable[..., Any], *, request_stream: bool = False
    ) -> Callable[..., Any]:
        # With a request stream (Add), the role needed does not depend on its messages
        # (recovery adds included, see stream.security.roles): the call is admitted or refused
        # as a whole, before any message is read.
        async def guarded(request: Any, context: Context) -> AsyncIterator[Any]:
            await self._admit(rpc, None if request_stream else request, context)
            async for response in behavior(request, context):
                yield response

        return guarded

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Req, _Resp] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Req, _Resp] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        rpc = handler_call_details.method.rsplit("/", 1)[-1]
        if not self.enforce and rpc not in _AUDITED_RPCS and rpc != "Add":
            return handler  # nothing to check or to audit: no cost on reads
        kinds = (
            ("unary_unary", grpc.unary_unary_rpc_method_handler, self._unary),
            ("unary_stream", grpc.unary_stream_rpc_method_handler, self._streaming),
            (
                "stream_stream",
                grpc.stream_stream_rpc_method_handler,
                functools.partial(self._streaming, request_stream=True),
            ),
        )
        for kind, make, guard in kinds:
            behavior = getattr(handler, kind)
            if behavior is not None:
                return make(
                    guard(rpc, behavior),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler


def _is_loopback(host: str) -> bool:
    """Whether every address `host` resolves to is a loopback one."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    # An address family beyond IPv4 and IPv6 types its host as an int; str() covers the type.
    return bool(infos) and all(
        ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]).is_loopback for info in infos
    )


def refuse_insecure_listen(config: BookieConfig) -> None:
    """Raises ConfigError when the bookie would serve plaintext beyond loopback without
    `allow_insecure = true`."""
    if config.tls or config.allow_insecure:
        return
    data = config.data_bind()
    listens = [("listen", config.listen.rpartition(":")[0].strip("[]"))]
    listens += [] if data is None else [("data_listen", data[0])]
    for key, host in listens:
        if not _is_loopback(host):
            raise ConfigError(
                f"{key} {host} is not a loopback address and the bookie has no TLS: "
                "set tls_cert_file, tls_key_file and tls_ca_file, or allow_insecure = true",
                key="allow_insecure",
            )
