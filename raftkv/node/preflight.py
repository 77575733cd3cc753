"""What a node checks before it serves, each failure one line: its ports are free, and its release is
not older than the cluster version."""

from __future__ import annotations

import socket

from raftkv.core.errors import ConfigError
from raftkv.core.release import VERSION
from raftkv.meta.cluster_version import refusal


def check_ports(host: str, ports: list[tuple[str, int]], node_id: str) -> None:
    """Fail fast, with the port's name, before anything starts."""
    for name, port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as exc:
                raise ConfigError(f"cannot listen on {host}:{port} ({name}): {exc.strerror}; "
                                  "is another node or program using it?", source=f"node {node_id}") from None


def check_release(cluster_version: str, node_id: str, release: str = VERSION) -> None:
    if too_old := refusal(cluster_version, release):
        raise ConfigError(too_old, source=f"node {node_id}")
