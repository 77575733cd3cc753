"""The web console of a node (raftkv/console/): what it reads of the node, and its start on the metrics
port in place of prometheus_client's own server (docs/console.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from raftkv.console.http import ConsoleApp
from raftkv.core.http_server import serve
from raftkv.console.sampler import ReplicaView
from raftkv.console.service import Console
from raftkv.core.errors import ConfigError
from raftkv.core.learner_registry import learners_from
from raftkv.meta.records import ClusterMeta
from raftkv.node.gatekeeper import ANYONE
from raftkv.raft.group import Role
from raftkv.security.permissions import Identity, Request


class NodeConsoleHost:
    """`console.service.ConsoleHost` over a running node (`process.Node`, which imports this module)."""

    def __init__(self, node):
        self._node = node
        self.me_id = node.me_id
        self.partitions = node.spec.partitions
        self.data_dir = Path(node.me.data_dir)
        self.peers = node.peers

    def topology(self) -> ClusterMeta:
        return self._node.topology

    def meta_leader_id(self) -> str | None:
        return self._node.meta_leader_id()

    def caller(self, authorization: str) -> Identity:
        gate = self._node.gate
        return gate.bearer(authorization) if gate.enforcing else ANYONE

    def refusal(self, caller: Identity, request: Request) -> str | None:
        return self._node.gate.refusal(caller, [request])

    def replica_views(self) -> list[ReplicaView]:
        node = self._node
        topology, hub = node.topology, node.hub
        views = []
        for p, frontend in list(node.replicas.frontends.items()):
            r = frontend.replica
            if r.role != Role.LEADER:
                views.append(ReplicaView(p, False, r.group.term, r.storage_full))
                continue
            others = [n for n in topology.voters_of(p) if n != node.me_id] if p < len(topology.placement) else []
            learners = tuple((i.name, i.progress) for i in learners_from(r.engine.meta_items()).values())
            views.append(ReplicaView(p, True, r.group.term, r.storage_full,
                                     live_voters=1 + sum(hub is not None and hub.is_up(n) for n in others),
                                     last_data_index=r.last_data_index, learners=learners))
        return views


def start_console(node) -> Console:
    """Serve the metrics port (`/metrics` and the console); ConfigError when the port is taken. The caller
    runs `Console.run`, the sampling."""
    https = node.tls is not None and node.spec.tls.metrics
    console = Console(NodeConsoleHost(node), "https" if https else "http", token_needed=node.gate.enforcing)
    app = ConsoleApp(asyncio.get_running_loop(), console.answer)
    try:
        serve(app, node.me.host, node.me.metrics_port, node.tls.https_context() if https else None)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on port {node.me.metrics_port}: {exc.strerror}",
                          source=f"node {node.me.id} metrics_port") from None
    return console


def console_url(node) -> str:
    https = node.tls is not None and node.spec.tls.metrics
    return f"{'https' if https else 'http'}://{node.me.host}:{node.me.metrics_port}/"
