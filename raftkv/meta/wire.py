"""The topology to and from its gRPC message (`TopologyResponse`)."""

from __future__ import annotations

from dataclasses import dataclass

from raftkv.api import kv_pb2 as pb
from raftkv.meta.cluster_version import FIRST_RELEASE
from raftkv.meta.records import ClusterMeta, Move, MoveStep, NodeRecord, NodeState, decode_access, encode_access


@dataclass(frozen=True)
class Topology:
    meta: ClusterMeta
    meta_leader: str | None  # the node leading the metadata group, as the answering node believes
    spec_toml: str = ""  # the cluster's constants, as the answering node's spec has them


def topology_reply(meta: ClusterMeta, meta_leader: str | None, spec_toml: str = "",
                   with_access: bool = False) -> pb.TopologyResponse:
    """`with_access`: include the users and roles (a node or learner asks: it checks callers itself)."""
    return pb.TopologyResponse(
        epoch=meta.epoch,
        replication=meta.replication,
        nodes=[pb.NodeRecord(id=n.id, host=n.host, api_port=n.api_port, metrics_port=n.metrics_port,
                             raft_port_base=n.raft_port_base, meta_port=n.meta_port, state=n.state.value)
               for n in meta.nodes],
        placement=[pb.Voters(nodes=voters) for voters in meta.placement],
        meta_voters=pb.Voters(nodes=meta.meta_voters),
        moves=[pb.MoveInfo(group=m.group, source=m.source, target=m.target, step=m.step.value) for m in meta.moves],
        meta_leader=meta_leader or "",
        spec_toml=spec_toml,
        cluster_id=meta.cluster_id,
        cluster_version=meta.cluster_version,
        access=encode_access(meta.users, meta.roles) if with_access else b"",
    )


def topology_of(reply: pb.TopologyResponse) -> Topology:
    meta = ClusterMeta(
        epoch=reply.epoch,
        replication=reply.replication,
        nodes=tuple(NodeRecord(n.id, n.host, n.api_port, n.metrics_port, n.raft_port_base, n.meta_port,
                               NodeState(n.state)) for n in reply.nodes),
        placement=tuple(tuple(v.nodes) for v in reply.placement),
        meta_voters=tuple(reply.meta_voters.nodes),
        moves=tuple(Move(m.group, m.source, m.target, MoveStep(m.step)) for m in reply.moves),
        cluster_id=reply.cluster_id,
        cluster_version=reply.cluster_version or FIRST_RELEASE,  # a node of the first release sends none
        **(decode_access(reply.access) if reply.access else {}),
    )
    return Topology(meta, reply.meta_leader or None, reply.spec_toml)
