"""Looking at and steering Raft leadership in a test cluster, through the nodes' own ports."""

from __future__ import annotations

import subprocess
import sys

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc


def statuses(addresses: list[str]) -> list[tuple[str, pb.PartitionStatus]]:
    """(node id, status) of every partition hosted by the nodes that answer."""
    out = []
    for address in addresses:
        try:
            with grpc.insecure_channel(address) as channel:
                reply = kv_pb2_grpc.KVStub(channel).Status(pb.StatusRequest(), timeout=2)
            out += [(reply.node_id, ps) for ps in reply.hosted]
        except grpc.RpcError:
            pass
    return out


def leader_of(addresses: list[str], partition: int = 0) -> str | None:
    """The node that says it leads `partition` (an isolated old leader may still say so)."""
    return next((node for node, ps in statuses(addresses) if ps.partition == partition and ps.role == "leader"),
                None)


def transfer_leadership(spec, partition: int, leader: str, target: str) -> None:
    """pysyncobj's own admin tool, sent to the current leader's Raft port."""
    subprocess.run(
        [sys.executable, "-m", "pysyncobj.syncobj_admin", "-conn", spec.node(leader).raft_address(partition),
         "-transfer", spec.node(target).raft_address(partition)],
        check=True, capture_output=True, timeout=30,
    )
