"""raftkv: a Raft-replicated, partitioned key-value store over RocksDB."""

from raftkv.client.async_client import AsyncClient
from raftkv.client.sync_client import Client, NodeStatus, Read, Topology
from raftkv.core.commands import CasResult, Delete, DeleteRange, Put
from raftkv.core.errors import (
    ChangeRefused, ConfigError, CorruptData, InvalidRequest, NotLeader, RaftKVError, StorageFull, Timeout, Unavailable,
    Undetermined,
)

__all__ = [
    "AsyncClient", "CasResult", "ChangeRefused", "Client", "ConfigError", "CorruptData", "Delete", "DeleteRange", "InvalidRequest", "NodeStatus",
    "NotLeader", "Put", "RaftKVError", "Read", "StorageFull", "Timeout", "Topology", "Unavailable",
    "Undetermined",
]
