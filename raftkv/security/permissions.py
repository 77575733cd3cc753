"""Who may do what: roles granting read, write or admin per key prefix (etcd's model). Pure.

A grant of a level on a prefix covers every key that starts with it (b"" is the whole keyspace),
and a level includes the ones below it: admin > write > read. A user may do what any of its
roles grants. An admin verb (learners, backups, membership, leader transfer, a chaos run against
a live cluster) needs admin on the whole keyspace. A batch is allowed only whole.

Nodes and learners are identified by their certificates' role, not by users: a node may do
anything (it forwards users' requests after checking them where they arrived); a learner may read
(it streams every entry of its partitions anyway) and report its progress and its release.

`check` answers None (allowed) or the one line a denied request gets, naming the user, the
operation and the key or verb.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Iterable, Mapping

from raftkv.storage.engine import prefix_end


class Access(IntEnum):
    READ = 1
    WRITE = 2
    ADMIN = 3

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Grant:
    access: Access
    prefix: bytes = b""

    def covers(self, access: Access, start: bytes, end: bytes | None) -> bool:
        """Every key in [start, end) (end None: no bound) at `access`."""
        if access > self.access or not start.startswith(self.prefix):
            return False
        if not self.prefix:
            return True
        limit = prefix_end(self.prefix)
        return limit is None or (end is not None and end <= limit)


@dataclass(frozen=True)
class Identity:
    """Who is asking: a user by name (client certificate CN or token), or a node or a learner
    process by its certificate's role."""

    name: str
    kind: str = "user"  # "user" | "node" | "learner"


ANY_IDENTITY_VERBS = frozenset({"topology", "status"})  # where partitions are and who is up: needed to route
LEARNER_VERBS = ANY_IDENTITY_VERBS | {"report_progress", "report_release"}


@dataclass(frozen=True)
class Request:
    """One operation of a request: keys [start, end) at an access level, or an admin verb."""

    access: Access
    start: bytes = b""
    end: bytes | None = None  # exclusive; None: to the end of the keyspace
    verb: str = ""

    @classmethod
    def key(cls, access: Access, key: bytes) -> Request:
        return cls(access, key, key + b"\x00")

    @classmethod
    def admin(cls, verb: str) -> Request:
        return cls(Access.ADMIN, verb=verb)

    def describe(self) -> str:
        if self.verb:
            return f"run {self.verb}"
        if self.end == self.start + b"\x00":
            return f"{self.access} key {self.start!r}"
        return f"{self.access} keys [{self.start!r}, {'the end' if self.end is None else repr(self.end)})"


def check(identity: Identity, requests: Iterable[Request], user_roles: Mapping[str, Iterable[str]],
          role_grants: Mapping[str, Iterable[Grant]]) -> str | None:
    """None if `identity` may make every request; else the reason, naming the first it may not."""
    if identity.kind == "node":
        return None
    if identity.kind == "learner":
        grants, verbs = [Grant(Access.READ)], LEARNER_VERBS
    else:
        grants = [g for role in user_roles.get(identity.name, ()) for g in role_grants.get(role, ())]
        verbs = ANY_IDENTITY_VERBS
    for request in requests:
        if request.verb in verbs or any(g.covers(request.access, request.start, request.end) for g in grants):
            continue
        return f"permission denied: {identity.kind} {identity.name} may not {request.describe()}"
    return None
