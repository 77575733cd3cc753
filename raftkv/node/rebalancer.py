"""What the metadata leader does by itself, every `rebalance_interval` (docs/elasticity.md §4, §6).

- asks every node for its status: who answers is alive, and who leads which partition;
- marks a node dead once it has not answered for `dead_after`, and up again when a dead one answers;
- removes a draining or dead node once it holds nothing;
- raises the cluster version once every member runs a newer release (raftkv/meta/cluster_version.py);
- runs the planner (`raftkv.meta.planner`) and starts its moves (`BeginMove`; the mover runs them)
  and leader transfers.

What to do is `rebalance_steps`' pure decision, given the time; this module polls, proposes and
transfers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.core.errors import RaftKVError
from raftkv.core.spec import Tuning
from raftkv.meta.cluster_version import version_to_raise
from raftkv.meta.planner import PlannedTransfer, leaders_from
from raftkv.meta.records import BeginMove, ClusterMeta, MetaCommand, NodeState, group_name
from raftkv.node.mover import RPC_TIMEOUT, on_leader
from raftkv.node.peers import Peers, brief_status
from raftkv.node.rebalance_steps import Watch, balance, heard, judge

log = logging.getLogger(__name__)


class Rebalancer:
    def __init__(self, tuning: Tuning, topology: Callable[[], ClusterMeta], peers: Peers,
                 change: Callable[[MetaCommand], Awaitable[ClusterMeta]]):
        self._tuning = tuning
        self._topology = topology
        self._peers = peers
        self._change = change
        self._watch = Watch()

    def forget(self) -> None:
        """This node stopped leading the metadata group: a later term starts the clocks afresh."""
        self._watch = Watch(transfers=self._watch.transfers)

    async def run_once(self, rebalance: bool, now: float) -> None:
        """One round at time `now`: poll, judge liveness, raise the cluster version, and (`rebalance`) plan."""
        releases, leaders, learners = await self._poll(self._topology(), now)
        for change, silent in judge(self._topology(), self._watch, set(releases), now, self._tuning.dead_after):
            if await self._propose(change) and change.state == NodeState.DEAD:
                log.warning("%s has not answered for %.0fs: marked dead; its replicas are re-created elsewhere",
                            change.node_id, silent)
        meta = self._topology()
        reported = dict(meta.learner_releases)
        raise_ = version_to_raise(meta.cluster_version, meta.members, releases, {n: reported.get(n) for n in learners})
        if raise_ and await self._propose(raise_):
            log.info("cluster version %s: every member runs it or newer", raise_.version)
        if not rebalance:
            return
        actions, self._watch = balance(self._topology(), leaders, self._watch, now, self._tuning)
        for action in actions:
            if isinstance(action, BeginMove):
                if await self._propose(action):
                    log.info("rebalance: moving %s from %s to %s", group_name(action.group),
                             action.source or "nowhere", action.target or "nowhere")
            elif isinstance(action, PlannedTransfer):
                await self._transfer(action)

    async def _poll(self, meta: ClusterMeta, now: float) -> tuple[dict[str, str], dict[int, str], set[str]]:
        """Each live node's statuses: the release of each node that answered, who leads each partition, and
        the learners registered in the partitions they host."""
        nodes = meta.members
        replies = await asyncio.gather(*(brief_status(self._peers, n) for n in nodes))
        releases = {node_id: reply.version for node_id, reply in zip(nodes, replies) if reply is not None}
        self._watch = heard(self._watch, nodes, set(releases), now)
        answered = [(node_id, reply) for node_id, reply in zip(nodes, replies) if reply is not None]
        # a release before the brief answer names its learners in its full one
        learners = {name for _, reply in answered for name in reply.learners}
        learners |= {ls.name for _, reply in answered for ps in reply.hosted for ls in ps.learners}
        return releases, leaders_from((node_id, ps.partition, ps.role, ps.term)
                                      for node_id, reply in answered for ps in reply.hosted), learners

    async def _transfer(self, action: PlannedTransfer) -> None:
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
