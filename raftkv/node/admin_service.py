"""The `Admin` gRPC service of a node: the topology, changes to it, and the replica verbs a move uses."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Protocol

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.console.service import Console
from raftkv.core import metrics
from raftkv.api.rpc_errors import error_metadata
from raftkv.core.errors import ChangeRefused, RaftKVError, Unauthenticated
from raftkv.meta.records import META, ClusterMeta, MetaCommand, decode_command
from raftkv.meta.wire import topology_reply
from raftkv.node.gatekeeper import Gatekeeper
from raftkv.node.hosted_replicas import HostedReplicas
from raftkv.node.lost_data import LostData
from raftkv.node.meta_replica import MetaReplica
from raftkv.node.mover import RPC_TIMEOUT
from raftkv.node.peers import Peers
from raftkv.node.replica import Replica
from raftkv.node.replica_copy import checkpoint_chunks
from raftkv.raft.group import Outcome, Role
from raftkv.security.permissions import Request

USERS = Request.admin("users")


class AdminHost(Protocol):
    """What the service needs of its node."""

    me_id: str
    replicas: HostedReplicas
    meta: MetaReplica
    peers: Peers
    topology: ClusterMeta
    spec_toml: str
    gate: Gatekeeper
    lost_data: LostData
    console: Console

    def meta_leader_id(self) -> str | None: ...

    def node_at(self, group: int, raft_address: str | None) -> str | None: ...

    async def change_topology(self, command: MetaCommand) -> ClusterMeta: ...


class AdminService(kv_pb2_grpc.AdminServicer):
    def __init__(self, node: AdminHost):
        self._node = node

    async def Topology(self, request, context) -> pb.TopologyResponse:
        """Open to every caller (clients route with it); the users and roles only to nodes, learners and admins."""
        try:
            caller = self._node.gate.caller(context)
            trusted = caller.kind in ("node", "learner") or self._node.gate.refusal(caller, [USERS]) is None
        except Unauthenticated:
            trusted = False
        return topology_reply(self._node.topology, self._node.meta_leader_id(), self._node.spec_toml, trusted)

    async def ChangeTopology(self, request: pb.ChangeTopologyRequest, context) -> pb.TopologyResponse:
        await self._node.gate.admit(context, Request.admin("change_topology"))
        try:
            command = decode_command(request.command)
        except (ValueError, KeyError, TypeError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a metadata command: {exc}")
        try:
            meta = await self._node.change_topology(command)
        except ChangeRefused as refused:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(refused))
        except grpc.aio.AioRpcError as exc:  # forwarded, and the metadata leader answered so
            await context.abort(exc.code(), exc.details())
        except Exception as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return topology_reply(meta, self._node.meta_leader_id(), self._node.spec_toml)

    async def ReplicaProgress(self, request: pb.ReplicaRequest, context) -> pb.ReplicaState:
        await self._node.gate.admit(context, Request.admin("replica_progress"))
        node, g = self._node, request.group
        if g == META:
            replica, mode = node.meta, "voter" if node.meta.voting else "learner"
        elif g in node.replicas.frontends:
            replica, mode = node.replicas.frontends[g].replica, "voter"
        elif g in node.replicas.learning:
            replica, mode = node.replicas.learning[g], "learner"
        elif g in node.replicas.copying:
            return pb.ReplicaState(mode="copying", snapshot_bytes_received=node.replicas.copying[g].received)
        else:
            return pb.ReplicaState(mode="none")
        group = replica.group
        guard = node.lost_data.guards.get(g)
        return pb.ReplicaState(mode=mode, applied_index=group.last_applied, commit_index=group.commit_index,
                               term=group.term, guarded=guard is not None and guard.waiting,
                               snapshot_bytes_received=group.snapshot_bytes_received,
                               leader=node.node_at(g, replica.leader_address) or "",
                               log_index_term=(request.log_index and group.term_at(request.log_index)) or 0,
                               base=[pb.LogEntry(command=c, index=i, term=t)
                                     for c, i, t in (request.log_index and group.log_base_at(request.log_index)) or ()])

    async def Checkpoint(self, request: pb.ReplicaRequest, context):
        await self._node.gate.admit(context, Request.admin("checkpoint"))
        frontend = self._node.replicas.frontends.get(request.group)
        if frontend is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"{self._node.me_id} holds no voter of partition {request.group}")
        if request.linearizable:
            try:
                await frontend.barrier()
            except RaftKVError as error:  # not the leader (the error names it), or no quorum
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(error), trailing_metadata=error_metadata(error))
        sent = metrics.CHECKPOINT_BYTES_SENT.labels(request.group)
        async for chunk in checkpoint_chunks(frontend.replica):
            sent.inc(len(chunk.data))
            yield chunk

    async def _leading(self, g: int, node_id: str, context) -> tuple[Replica, Callable[[], Awaitable], str] | \
            pb.ChangeMembershipResponse:
        """The group's replica, its barrier and `node_id`'s Raft address in it, when this node leads the
        group; else the answer that says who does."""
        node = self._node
        if g == META:
            replica, barrier = node.meta, node.meta.barrier
        elif g in node.replicas.frontends:
            replica, barrier = node.replicas.frontends[g].replica, node.replicas.frontends[g].barrier
        else:
            return pb.ChangeMembershipResponse(done=False)
        if replica.role != Role.LEADER:
            return pb.ChangeMembershipResponse(done=False, leader=node.node_at(g, replica.leader_address) or "")
        try:
            return replica, barrier, node.topology.node(node_id).raft_address(g)
        except ChangeRefused as refused:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(refused))

    async def ChangeMembership(self, request: pb.ChangeMembershipRequest, context) -> pb.ChangeMembershipResponse:
        await self._node.gate.admit(context, Request.admin("change_membership"))
        node = self._node
        leading = await self._leading(request.group, request.node, context)
        if isinstance(leading, pb.ChangeMembershipResponse):
            return leading
        replica, barrier, address = leading
        adding = request.action == "add"
        if (address in replica.group.voters) == adding:
            # A change counts from when it is appended, so "already a member" may still be uncommitted
            # (and undone by a new leader): an entry committed after it commits it too.
            try:
                await asyncio.wait_for(barrier(), RPC_TIMEOUT)
            except Exception:
                return pb.ChangeMembershipResponse(done=False)
            return pb.ChangeMembershipResponse(done=True, leader=node.me_id)
        if not adding and request.node == node.me_id:
            replica.group.transfer_leadership()  # a leader cannot remove itself; the next one will
            return pb.ChangeMembershipResponse(done=False)
        change = replica.group.add_member if adding else replica.group.remove_member
        try:
            outcome = await asyncio.wait_for(_outcome_of(change, address), RPC_TIMEOUT)
        except asyncio.TimeoutError:
            outcome = Outcome.UNKNOWN
        return pb.ChangeMembershipResponse(done=outcome == Outcome.APPLIED, leader=node.me_id)

    async def TransferLeadership(self, request: pb.TransferLeadershipRequest, context) -> pb.ChangeMembershipResponse:
        await self._node.gate.admit(context, Request.admin("transfer_leadership"))
        node, g = self._node, request.group
        if request.node == node.me_id and g in node.replicas.frontends and node.replicas.frontends[g].is_leader:
            return pb.ChangeMembershipResponse(done=True, leader=node.me_id)
        leading = await self._leading(g, request.node, context)
        if isinstance(leading, pb.ChangeMembershipResponse):
            return leading
        replica, _, address = leading
        if address not in replica.group.voters:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"{request.node} holds no replica of partition {g}; leadership goes only to a voter")
        replica.group.transfer_leadership(address)  # best effort: the new leader shows in Status when it took over
        return pb.ChangeMembershipResponse(done=True, leader=node.me_id)

    async def Compact(self, request: pb.ReplicaRequest, context) -> pb.ChangeMembershipResponse:
        await self._node.gate.admit(context, Request.admin("compact"))
        frontend = self._node.replicas.frontends.get(request.group)
        if frontend is None or not frontend.is_leader:
            hint = frontend.not_leader().leader_hint if frontend is not None else None
            return pb.ChangeMembershipResponse(done=False, leader=hint or "")
        frontend.replica.maybe_compact(eager=True)
        return pb.ChangeMembershipResponse(done=True, leader=self._node.me_id)

    async def NodeReport(self, request: pb.NodeReportRequest, context) -> pb.NodeReportResponse:
        await self._node.gate.admit(context, Request.admin("status"))
        return self._node.console.report()

    async def Reseed(self, request: pb.ReplicaRequest, context) -> pb.ChangeMembershipResponse:
        await self._node.gate.admit(context, Request.admin("reseed"))
        return pb.ChangeMembershipResponse(done=self._node.replicas.reseed(request.group), leader=self._node.me_id)


def _outcome_of(change: Callable, address: str) -> asyncio.Future:
    """The outcome of a membership change (REJECTED while another is in flight, or before the leader's
    first entry of its term is committed: the Raft adapter's guard, docs/elasticity.md §3)."""
    future = asyncio.get_running_loop().create_future()
    change(address, lambda _result, outcome: future.done() or future.set_result(outcome))
    return future

