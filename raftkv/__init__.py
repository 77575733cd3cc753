"""raftkv: a Raft-replicated, partitioned key-value store over RocksDB."""

import os

# gRPC's core logs every failed TLS handshake to stderr at INFO, beside the one line raftkv prints for it;
# GRPC_VERBOSITY=INFO brings those back (e.g. on a node, to see who was refused).
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from raftkv.client.async_client import AsyncClient
from raftkv.client.sync_client import Client, NodeStatus, Read, Topology
from raftkv.core.commands import CasResult, Delete, DeleteRange, Put
from raftkv.core.errors import (
    ChangeRefused, ConfigError, CorruptData, InvalidRequest, NotLeader, PermissionDenied, RaftKVError,
    ResourceExhausted, StorageFull, Timeout, Unauthenticated, Unavailable, Undetermined,
)
from raftkv.security.tls import Tls

__all__ = [
    "AsyncClient", "CasResult", "ChangeRefused", "Client", "ConfigError", "CorruptData", "Delete", "DeleteRange", "InvalidRequest", "NodeStatus",
    "NotLeader", "PermissionDenied", "Put", "RaftKVError", "Read", "ResourceExhausted", "StorageFull", "Timeout", "Tls", "Topology", "Unauthenticated",
    "Unavailable", "Undetermined",
]
