"""raftkv: a Raft-replicated, partitioned key-value store over RocksDB."""

from raftkv.async_client import AsyncClient
from raftkv.client import Client, NodeStatus, Read
from raftkv.commands import CasResult, Delete, DeleteRange, Put
from raftkv.errors import (
    ConfigError,
    CorruptData,
    InvalidRequest,
    NotLeader,
    RaftKVError,
    StorageFull,
    Timeout,
    Unavailable,
    Undetermined,
)

__all__ = [
    "AsyncClient", "CasResult", "Client", "ConfigError", "CorruptData", "Delete", "DeleteRange", "InvalidRequest", "NodeStatus",
    "NotLeader", "Put", "RaftKVError", "Read", "StorageFull", "Timeout", "Unavailable", "Undetermined",
]
