"""A learner's `--api-port`: the node API over its copies, and the ChangeLog service of a sink that keeps
its changes. Imported only when the port is asked for: a learner without it does not load the node's
service stack."""

from __future__ import annotations

import asyncio
from typing import Callable

import grpc

from learners.changelog_service import ChangeLogService, ChangeSource
from learners.learner_replica import LearnerReplica
from learners.sinks.base import Sink
from raftkv.api import kv_pb2_grpc
from raftkv.core.spec import ClusterSpec
from raftkv.meta.records import ClusterMeta
from raftkv.node.gatekeeper import Gatekeeper
from raftkv.node.group_commit import PartitionFrontend
from raftkv.node.peers import Peers
from raftkv.node.reads import LocalReads
from raftkv.node.service import KVService, api_server
from raftkv.security.tls import Tls, listen


async def serve_reads(spec: ClusterSpec, tls: Tls | None, topology: ClusterMeta, name: str,
                      replicas: dict[int, LearnerReplica], address: str, loop: asyncio.AbstractEventLoop, sink: Sink,
                      current: Callable[[], ClusterMeta]) -> tuple[grpc.aio.Server, KVService]:
    """The node API over the learner's copies: follower reads and scans here, the rest forwarded to leaders
    (with the cluster's TLS a learner may only read, so writes must go to the nodes themselves).

    A sink that keeps the changes it received (the `changelog` sink) is served as the ChangeLog service.
    Its callers are checked against the users and roles of `current()` metadata.
    """
    frontends = {}
    for p, replica in replicas.items():
        by_address = {n.raft_address(p): n.id for n in topology.nodes}
        frontends[p] = PartitionFrontend(replica, loop, max_batch_ops=1, max_batch_bytes=1, request_timeout=1.0,
                                         leader_id_of=by_address.get)
    gate = Gatekeeper(enforce=spec.tls is not None, meta=current)
    service = KVService(spec, f"learner/{name}", frontends, LocalReads(frontends), lambda: topology,
                        Peers(lambda node_id: topology.node(node_id).api_address, tls), gate)
    server = api_server()
    kv_pb2_grpc.add_KVServicer_to_server(service, server)
    if isinstance(sink, ChangeSource):
        kv_pb2_grpc.add_ChangeLogServicer_to_server(ChangeLogService(sink, loop, gate), server)
    listen(server, address, tls)
    await server.start()
    return server, service
