"""Looking at and steering Raft leadership in a test cluster, through the nodes' own ports."""

from __future__ import annotations

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.client.sync_client import Client
from raftkv.security.tls import client_tls
from tests.conftest import wait_until


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


def transfer_leadership(spec, partition: int, target: str) -> None:
    """Through the Admin API: pysyncobj's own admin commands do not reach a Raft port."""
    with Client([n.api_address for n in spec.nodes], timeout=30, tls=client_tls(spec)) as kv:
        kv.transfer_leadership(partition, target)


def lead(cluster, partition: int, node: str, timeout: float = 30) -> None:
    """Until `node` leads `partition`: a transfer is refused while it lacks an entry, so it is asked again."""
    def led() -> bool:
        if leader_of(cluster.endpoints, partition) == node:
            return True
        transfer_leadership(cluster.spec, partition, node)
        return False

    wait_until(led, timeout, f"{node} to lead partition {partition}", interval=0.5)
