"""What refuses a node's start in one line instead of a traceback: a port it needs is taken, or its data
dir is in use by another process."""

from __future__ import annotations

import contextlib
import socket

from raftkv.core.errors import ConfigError, RaftKVError
from raftkv.core.spec import NodeSpec


def check_ports(me: NodeSpec, partitions: int) -> None:
    """Fail fast, with the port's name, before anything starts. Every port of the node's block,
    partitions it does not hold included: any may move here."""
    ports = ([("api_port", me.api_port), ("metrics_port", me.metrics_port)]
             + [(f"raft port of partition {p}", me.raft_port_base + p) for p in range(partitions)]
             + [("metadata raft port", me.meta_port(partitions))])
    for name, port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((me.host, port))
            except OSError as exc:
                raise ConfigError(
                    f"cannot listen on {me.host}:{port} ({name}): {exc.strerror}; "
                    "is another node or program using it?",
                    source=f"node {me.id}",
                ) from None


@contextlib.contextmanager
def opening(me: NodeSpec):
    """Opening a replica of node `me`: a data dir in use becomes the line that says so."""
    try:
        yield
    except RaftKVError:
        raise
    except Exception as exc:
        if "/LOCK:" in str(exc):  # RocksDB's lock file (not "block checksum mismatch")
            raise ConfigError(
                f"{me.data_dir} is in use by another process (is node {me.id} already running?)",
                source=f"node {me.id}",
            ) from None
        raise
