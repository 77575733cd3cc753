"""Users and roles in the cluster's metadata (docs/security.md §5). Pure: values in, values out.

A role grants read, write or admin on key prefixes; a user has roles, and may have a bearer
token, of which only the SHA-256 is kept. The built-in role `root` grants admin on every key and
cannot be changed; a cluster with TLS starts with the user `admin` holding it (the user whose
certificate `raftkv cluster init` makes). The checks themselves are `security.permissions`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from raftkv.core.errors import ChangeRefused
from raftkv.security.permissions import Access, Grant

ROOT_ROLE = "root"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # as a certificate's common name
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class UserRecord:
    name: str
    roles: tuple[str, ...] = ()
    token_sha256: str = ""  # hex; "": no token, the user authenticates with a certificate only


@dataclass(frozen=True)
class Permission:
    access: str  # "read" | "write" | "admin"
    prefix: str  # hex of the key prefix ("": every key)

    def grant(self) -> Grant:
        return Grant(Access[self.access.upper()], bytes.fromhex(self.prefix))


@dataclass(frozen=True)
class RoleRecord:
    name: str
    permissions: tuple[Permission, ...] = ()


@dataclass(frozen=True)
class PutUser:
    """Add a user, or set an existing one's roles (and token, unless `keep_token`)."""

    user: UserRecord
    keep_token: bool = False


@dataclass(frozen=True)
class RemoveUser:
    name: str


@dataclass(frozen=True)
class GrantPermission:
    role: str
    permission: Permission


@dataclass(frozen=True)
class RevokePermission:
    role: str
    prefix: str  # hex


AccessCommand = PutUser | RemoveUser | GrantPermission | RevokePermission


def apply_access(users: tuple[UserRecord, ...], roles: tuple[RoleRecord, ...],
                 command: AccessCommand) -> tuple[tuple[UserRecord, ...], tuple[RoleRecord, ...]]:
    """The users and roles after `command`, or ChangeRefused."""
    if isinstance(command, PutUser):
        user = command.user
        _check_name(user.name, "user")
        for role in user.roles:
            _check_name(role, "role")
        if user.token_sha256 and not _SHA256.match(user.token_sha256):
            raise ChangeRefused("a token is kept as its SHA-256 in hex")
        known = next((u for u in users if u.name == user.name), None)
        if command.keep_token and known is not None:
            user = replace(user, token_sha256=known.token_sha256)
        return tuple(u for u in users if u.name != user.name) + (user,), roles
    if isinstance(command, RemoveUser):
        if not any(u.name == command.name for u in users):
            raise ChangeRefused(f"there is no user {command.name!r}")
        return tuple(u for u in users if u.name != command.name), roles
    _check_name(command.role, "role")
    if command.role == ROOT_ROLE:
        raise ChangeRefused(f"the role {ROOT_ROLE} grants admin on every key and cannot be changed")
    known = next((r for r in roles if r.name == command.role), RoleRecord(command.role))
    others = tuple(r for r in roles if r.name != command.role)
    if isinstance(command, GrantPermission):
        permission = command.permission
        if permission.access not in ("read", "write", "admin"):
            raise ChangeRefused(f"{permission.access!r} is not an access level: read, write or admin")
        _check_hex(permission.prefix)
        kept = tuple(p for p in known.permissions if p.prefix != permission.prefix)
        return users, others + (replace(known, permissions=kept + (permission,)),)
    _check_hex(command.prefix)
    if not any(p.prefix == command.prefix for p in known.permissions):
        raise ChangeRefused(f"role {command.role} has no permission on that prefix")
    kept = tuple(p for p in known.permissions if p.prefix != command.prefix)
    return users, others + ((replace(known, permissions=kept),) if kept else ())


def user_roles(users: tuple[UserRecord, ...]) -> dict[str, tuple[str, ...]]:
    return {u.name: u.roles for u in users}


def role_grants(roles: tuple[RoleRecord, ...]) -> dict[str, tuple[Grant, ...]]:
    grants = {r.name: tuple(p.grant() for p in r.permissions) for r in roles}
    grants[ROOT_ROLE] = (Grant(Access.ADMIN),)
    return grants


def _check_name(name: str, what: str) -> None:
    if not _NAME.match(name):
        raise ChangeRefused(f"{name!r} cannot be a {what} name: letters, digits, '.', '_' and '-', up to 64")


def _check_hex(prefix: str) -> None:
    try:
        bytes.fromhex(prefix)
    except ValueError:
        raise ChangeRefused(f"{prefix!r} is not a key prefix in hex") from None
