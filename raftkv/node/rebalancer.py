"""What the metadata leader does by itself, every `rebalance_interval` (docs/elasticity.md §4, §6).

- asks every node for its status: who answers is alive, and who leads which partition;
- marks a node dead once it has not answered for `dead_after`, and up again when a dead one answers;
- removes a draining or dead node once it holds nothing;
- raises the cluster version once every member runs a newer release (raftkv/meta/cluster_version.py);
- runs the planner (`raftkv.meta.planner`) and starts its moves (`BeginMove`; the mover runs them)
  and leader transfers.

Liveness is judged only here, on the metadata leader, from its own polls; a new metadata leader
starts every node's clock afresh, so a leader change can delay a dead verdict but never hasten one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.core.errors import RaftKVError
from raftkv.core.spec import Tuning
from raftkv.meta.cluster_version import version_to_raise
from raftkv.meta.planner import PlannedMove, PlannedTransfer, leaders_from, plan
from raftkv.meta.liveness import verdicts
from raftkv.meta.records import BeginMove, ClusterMeta, MetaCommand, NodeState, group_name
from raftkv.node.mover import RPC_TIMEOUT, on_leader
from raftkv.node.peers import Peers

log = logging.getLogger(__name__)

STATUS_TIMEOUT = 1.0


class Rebalancer:
    def __init__(self, tuning: Tuning, topology: Callable[[], ClusterMeta], peers: Peers,
                 change: Callable[[MetaCommand], Awaitable[ClusterMeta]]):
        self._tuning = tuning
        self._topology = topology
        self._peers = peers
        self._change = change
        self._last_seen: dict[str, float] = {}
        self._transfers: dict[int, float] = {}  # partition -> when a transfer was last asked for

    def forget(self) -> None:
        """This node stopped leading the metadata group: a later term starts the clocks afresh."""
        self._last_seen.clear()

    async def run_once(self, rebalance: bool) -> None:
        releases, leaders = await self._poll(self._topology())
        now = time.monotonic()
        silent = {node: now - seen for node, seen in self._last_seen.items()}
        for change in verdicts(self._topology(), silent, set(releases), self._tuning.dead_after):
            if await self._propose(change) and change.state == NodeState.DEAD:
                log.warning("%s has not answered for %.0fs: marked dead; its replicas are re-created elsewhere",
                            change.node_id, silent[change.node_id])
        meta = self._topology()
        if (raise_ := version_to_raise(meta.cluster_version, meta.members, releases)) and await self._propose(raise_):
            log.info("cluster version %s: every member runs it or newer", raise_.version)
        if not rebalance:
            return
        for action in plan(self._topology(), leaders, max_moves=self._tuning.max_moves,
                           max_moves_per_node=self._tuning.max_moves_per_node):
            if isinstance(action, PlannedMove):
                if await self._propose(BeginMove(action.partition, action.source, action.target)):
                    log.info("rebalance: moving %s from %s to %s", group_name(action.partition),
                             action.source or "nowhere", action.target or "nowhere")
            elif isinstance(action, PlannedTransfer):
                await self._transfer(action)

    async def _poll(self, meta: ClusterMeta) -> tuple[dict[str, str], dict[int, str]]:
        """Each live node's statuses: the release of each node that answered, and who leads each partition."""
        nodes = meta.members
        replies = await asyncio.gather(*(self._status(n) for n in nodes))
        now = time.monotonic()
        for node_id, reply in zip(nodes, replies):
            self._last_seen.setdefault(node_id, now)  # a node first heard of starts its clock now
            if reply is not None:
                self._last_seen[node_id] = now
        releases = {node_id: reply.version for node_id, reply in zip(nodes, replies) if reply is not None}
        return releases, leaders_from((node_id, ps.partition, ps.role, ps.term)
                                      for node_id, reply in zip(nodes, replies) if reply is not None
                                      for ps in reply.hosted)

    async def _status(self, node_id: str) -> pb.StatusResponse | None:
        try:
            return await self._peers.stub(node_id).Status(pb.StatusRequest(), timeout=STATUS_TIMEOUT)
        except grpc.aio.AioRpcError:
            return None

    async def _transfer(self, action: PlannedTransfer) -> None:
        if time.monotonic() - self._transfers.get(action.partition, 0) < 5 * self._tuning.election_timeout_max:
            return  # the last transfer may not show in the statuses yet
        self._transfers[action.partition] = time.monotonic()
        request = pb.TransferLeadershipRequest(group=action.partition, node=action.target)
        try:
            await on_leader(self._peers, lambda: self._topology().group_voters(action.partition),
                            lambda admin: admin.TransferLeadership(request, timeout=RPC_TIMEOUT),
                            f"partition {action.partition}: leadership to {action.target}", timeout=RPC_TIMEOUT)
        except Exception as exc:
            log.info("rebalance: %s", exc)

    async def _propose(self, command: MetaCommand) -> bool:
        try:
            await self._change(command)
            return True
        except (RaftKVError, grpc.aio.AioRpcError) as exc:  # refused, or the metadata leader moved: next round
            log.info("rebalance: %s: %s", type(command).__name__, exc)
            return False
