"""The metadata a cluster starts from: its spec's nodes and placement."""

from __future__ import annotations

import uuid

from raftkv.core.partitioning import replicas_for
from raftkv.core.spec import ClusterSpec, NodeSpec
from raftkv.meta.access import ROOT_ROLE, UserRecord
from raftkv.meta.records import Bootstrap, ClusterMeta, NodeRecord, meta_voter_count
from raftkv.security.certs import ADMIN_USER


def node_record(spec: ClusterSpec, node: NodeSpec) -> NodeRecord:
    return NodeRecord(node.id, node.host, node.api_port, node.metrics_port, node.raft_port_base,
                      node.meta_port(spec.partitions))


def bootstrap_command(spec: ClusterSpec) -> Bootstrap:
    return Bootstrap(
        replication=spec.replication,
        nodes=tuple(node_record(spec, n) for n in spec.nodes),
        placement=tuple(replicas_for(p, spec.node_ids, spec.replication) for p in range(spec.partitions)),
        meta_voters=first_meta_voters(spec.node_ids),
        cluster_id=uuid.uuid4().hex,
        # with TLS every request is checked; the user whose certificate `cluster init` made may do everything
        users=(UserRecord(ADMIN_USER, (ROOT_ROLE,)),) if spec.tls else (),
    )


def first_meta_voters(node_ids: tuple[str, ...]) -> tuple[str, ...]:
    return node_ids[:meta_voter_count(len(node_ids))]


def spec_meta(spec: ClusterSpec) -> ClusterMeta:
    """What the metadata will be once bootstrapped (epoch 0 says it is not yet)."""
    command = bootstrap_command(spec)
    return ClusterMeta(epoch=0, replication=command.replication, nodes=command.nodes, placement=command.placement,
                       meta_voters=command.meta_voters, users=command.users)
