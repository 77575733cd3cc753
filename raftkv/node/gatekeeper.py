"""Who is calling, and whether they may (docs/security.md §5): the servicers ask here first.

With the cluster's TLS every call is checked against the users and roles in the metadata; a
cluster without TLS has nobody to check (its clients are not authenticated), so everything is
allowed, as before. The caller is the user a bearer token belongs to (`authorization: Bearer
...`, only its SHA-256 is kept), else who the client certificate names: a node, a learner process
or a user. The decisions are `security.permissions.check`, pure.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Callable, Iterable, NamedTuple

import grpc
from cryptography import x509

from raftkv.api import kv_pb2 as pb
from raftkv.api.rpc_errors import error_metadata
from raftkv.core.command_kinds import kind_of
from raftkv.core.commands import Command
from raftkv.core.errors import ConfigError, PermissionDenied, Unauthenticated
from raftkv.meta.access import role_grants, user_roles
from raftkv.meta.records import ClusterMeta
from raftkv.security.certs import identity_of
from raftkv.security.permissions import Access, Grant, Identity, Request, check

ANYONE = Identity("", "node")  # a cluster without TLS: no one is authenticated, so no one is refused


class _Rules(NamedTuple):
    """The users and roles of one state of the metadata, as the checks look them up."""

    meta: ClusterMeta | None
    user_roles: dict[str, tuple[str, ...]]
    role_grants: dict[str, tuple[Grant, ...]]
    token_users: dict[str, str]  # SHA-256 of a token -> its user


class Gatekeeper:
    def __init__(self, enforce: bool, meta: Callable[[], ClusterMeta]):
        self._enforce = enforce
        self._meta = meta
        self._rules = _Rules(None, {}, {}, {})

    def caller(self, context) -> Identity:
        """Who is calling; Unauthenticated for a token that belongs to no one (revoked, or mistyped)."""
        if not self._enforce:
            return ANYONE
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and value.startswith("Bearer "):
                return self.bearer(value)
        pem = (context.auth_context().get("x509_pem_cert") or [b""])[0]
        try:
            return _certificate_identity(pem)
        except (ConfigError, ValueError) as exc:
            raise Unauthenticated(f"the client certificate names no raftkv identity: {exc}") from None

    @property
    def enforcing(self) -> bool:
        return self._enforce

    def bearer(self, authorization: str) -> Identity:
        """The user an `Authorization: Bearer <token>` value names (the gRPC metadata's, the console's
        HTTP header); Unauthenticated for one that names no one."""
        token = authorization[7:] if authorization.startswith("Bearer ") else ""
        name = self._current().token_users.get(hashlib.sha256(token.encode()).hexdigest()) if token else None
        if name is None:
            raise Unauthenticated("the token is no user's: revoked, or mistyped")
        return Identity(name, "user")

    @staticmethod
    def checks(caller: Identity) -> bool:
        """Whether `caller`'s requests are checked at all: a node's (and everyone's without TLS) are not."""
        return caller.kind != "node"

    def refusal(self, caller: Identity, requests: Iterable[Request]) -> str | None:
        rules = self._current()
        return check(caller, requests, rules.user_roles, rules.role_grants)

    async def admit(self, context, request: Request) -> Identity:
        """The caller of a call made of one request, refused whole: the call ends with the error (in its
        trailers too, for a streaming call, which has no response to carry it)."""
        try:
            caller = self.caller(context)
        except Unauthenticated as error:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(error))
        if (why := self.refusal(caller, [request])) is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, why,
                                trailing_metadata=error_metadata(PermissionDenied(why)))
        return caller

    def _current(self) -> _Rules:
        meta = self._meta()
        if self._rules.meta is not meta:
            self._rules = _Rules(meta, user_roles(meta.users), role_grants(meta.roles),
                                 {u.token_sha256: u.name for u in meta.users if u.token_sha256})
        return self._rules


@functools.lru_cache(maxsize=1024)
def _certificate_identity(pem: bytes) -> Identity:
    cert = identity_of(x509.load_pem_x509_certificate(pem))
    return Identity(cert.name, cert.role)


def op_requests(op: pb.Op, command: Command | None) -> list[Request]:
    """What an Execute operation asks for; `command` is the write it carries, None for a read."""
    if command is None:
        return [Request.key(Access.READ, op.get.key)]
    return command_requests(command)


def command_requests(command: Command) -> list[Request]:
    """Write access to every key the command may change, or the admin verb its kind names instead."""
    kind = kind_of(command)
    if kind.admin_verb:
        return [Request.admin(kind.admin_verb)]
    return [Request(Access.WRITE, start, end) for start, end in kind.ranges_written(command)]

