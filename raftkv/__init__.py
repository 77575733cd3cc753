"""raftkv: a Raft-replicated, partitioned key-value store over RocksDB.

The client's names are imported when first used (PEP 562): a node, a learner or the CLI that never
touches the client does not pay for importing it (gRPC's aio stack, the TLS helpers) at start.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

# gRPC's core logs every failed TLS handshake to stderr at INFO, beside the one line raftkv prints for it;
# GRPC_VERBOSITY=INFO brings those back (e.g. on a node, to see who was refused).
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
# A child started with a preexec_fn (dev up's nodes and learner die with it) is forked, not vforked, and
# gRPC's fork handlers then aborted about one child in fifteen (SIGABRT, SIGSEGV: "epoll_wait error: Bad
# file descriptor") while a client of the parent was busy. raftkv never uses gRPC in a forked child
# that does not exec at once. It must be set before grpc is imported: this package comes first.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

_WHERE = {
    "AsyncClient": "raftkv.client.async_client",
    **dict.fromkeys(("Client", "NodeStatus", "Read", "Topology"), "raftkv.client.sync_client"),
    **dict.fromkeys(("CasResult", "Delete", "DeleteRange", "Put"), "raftkv.core.commands"),
    **dict.fromkeys(("ChangeRefused", "ConfigError", "CorruptData", "InvalidRequest", "NotLeader", "PermissionDenied",
                     "RaftKVError", "ResourceExhausted", "StorageFull", "Timeout", "Unauthenticated", "Unavailable",
                     "Undetermined"), "raftkv.core.errors"),
    "Tls": "raftkv.security.tls",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'raftkv' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


if TYPE_CHECKING:
    from raftkv.client.async_client import AsyncClient
    from raftkv.client.sync_client import Client, NodeStatus, Read, Topology
    from raftkv.core.commands import CasResult, Delete, DeleteRange, Put
    from raftkv.core.errors import (ChangeRefused, ConfigError, CorruptData, InvalidRequest, NotLeader,
                                    PermissionDenied, RaftKVError, ResourceExhausted, StorageFull, Timeout,
                                    Unauthenticated, Unavailable, Undetermined)
    from raftkv.security.tls import Tls
