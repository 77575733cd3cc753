"""What a console page needs of the other nodes, asked of all of them at once over the gRPC calls
`raftkv status` uses (KV.Status) and Admin.NodeReport, each bounded: a node that does not answer in
time is unknown, and the page is drawn without it."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Protocol, TypeVar

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.console.views import Gathered
from raftkv.meta.records import ClusterMeta

PEER_TIMEOUT = 1.5  # seconds for each node's answer; a page answers within 2 s (docs/console.md §3)

T = TypeVar("T")


class PeerStubs(Protocol):
    def stub(self, node_id: str) -> kv_pb2_grpc.KVStub: ...

    def admin(self, node_id: str) -> kv_pb2_grpc.AdminStub: ...


async def _bounded(call: Callable[[], Awaitable[T]], timeout: float) -> T | None:
    try:
        return await asyncio.wait_for(call(), timeout)
    except asyncio.CancelledError:
        raise
    except Exception:  # down, refused, late, or stopping: all the same to the page
        return None


async def gather(me: str, partitions: int, topology: ClusterMeta, meta_leader: str | None, peers: PeerStubs,
                 scheme: str, moves: bool = False, timeout: float = PEER_TIMEOUT) -> Gathered:
    """Every member's status and report; with `moves`, each move's target's progress too."""
    nodes = topology.members
    targets = [m for m in topology.moves if m.target] if moves else []
    calls = ([_bounded(lambda n=n: peers.stub(n).Status(pb.StatusRequest(), timeout=timeout), timeout)
              for n in nodes]
             + [_bounded(lambda n=n: peers.admin(n).NodeReport(pb.NodeReportRequest(), timeout=timeout), timeout)
                for n in nodes]
             + [_bounded(lambda m=m: peers.admin(m.target).ReplicaProgress(pb.ReplicaRequest(group=m.group),
                                                                          timeout=timeout), timeout)
                for m in targets])
    replies = await asyncio.gather(*calls)
    count = len(nodes)
    return Gathered(at=time.time(), me=me, partitions=partitions, topology=topology, meta_leader=meta_leader,
                    statuses=dict(zip(nodes, replies[:count])), reports=dict(zip(nodes, replies[count:2 * count])),
                    progress={m.group: r for m, r in zip(targets, replies[2 * count:])}, scheme=scheme)
