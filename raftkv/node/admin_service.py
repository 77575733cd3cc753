"""The `Admin` gRPC service of a node: the topology, changes to it, and the replica verbs a move uses."""

from __future__ import annotations

from typing import AsyncIterator, Callable, Mapping

import grpc
from google.protobuf.message import DecodeError

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.core import metrics
from raftkv.api.rpc_errors import error_metadata, never_sent
from raftkv.core.errors import ChangeRefused, RaftKVError, Unauthenticated
from raftkv.meta.cluster_version import LearnerRelease
from raftkv.meta.records import decode_command
from raftkv.meta.wire import topology_reply
from raftkv.node.gatekeeper import Gatekeeper
from raftkv.node.peer_stops import PeerStops
from raftkv.node.ports import Answer, Proposals, ReplicaAdminPort, TopologyPort
from raftkv.security.permissions import Request

USERS = Request.admin("users")


class AdminService(kv_pb2_grpc.AdminServicer):
    """`voters`: the partitions this node holds a voter of (a checkpoint's read barrier); `report`: what
    this node's console tells the others' (`NodeReport`); `stops`: the nodes that said they stopped."""

    def __init__(self, node_id: str, spec_toml: str, gate: Gatekeeper, topology: TopologyPort,
                 voters: Mapping[int, Proposals], replicas: ReplicaAdminPort,
                 report: Callable[[], pb.NodeReportResponse], stops: PeerStops):
        self._node_id = node_id
        self._spec_toml = spec_toml
        self._gate = gate
        self._topology = topology
        self._voters = voters
        self._replicas = replicas
        self._report = report
        self._stops = stops

    async def Topology(self, request, context) -> pb.TopologyResponse:
        """Open to every caller (clients route with it); the users and roles only to nodes, learners and admins."""
        try:
            caller = self._gate.caller(context)
            trusted = caller.kind in ("node", "learner") or self._gate.refusal(caller, [USERS]) is None
        except Unauthenticated:
            trusted = False
        return topology_reply(self._topology.topology, self._topology.meta_leader_id(), self._spec_toml, trusted)

    async def ChangeTopology(self, request: pb.ChangeTopologyRequest, context) -> pb.TopologyResponse:
        try:
            command, malformed = decode_command(request.command), None
        except ValueError as exc:
            command, malformed = None, exc
        # A learner reports its own release (its only metadata command); everything else is an admin's.
        await self._gate.admit(context, Request.admin("report_release" if isinstance(command, LearnerRelease)
                                                      else "change_topology"))
        if malformed is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a metadata command: {malformed}")
        try:
            meta = await self._topology.change_topology(command)
        except ChangeRefused as refused:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(refused))
        except grpc.aio.AioRpcError as exc:  # forwarded, and the metadata leader answered so
            if never_sent(exc):  # in gRPC's words, the client would take this node for unreachable
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"the metadata leader {self._topology.meta_leader_id()} "
                                    f"did not answer {self._node_id} (it may be down; a new one is elected); retry")
            await context.abort(exc.code(), exc.details())
        except Exception as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return topology_reply(meta, self._topology.meta_leader_id(), self._spec_toml)

    async def ReplicaProgress(self, request: pb.ReplicaRequest, context) -> pb.ReplicaState:
        await self._gate.admit(context, Request.admin("replica_progress"))
        p = self._replicas.progress(request.group, request.log_index)
        return pb.ReplicaState(mode=p.mode, applied_index=p.applied_index, commit_index=p.commit_index, term=p.term,
                               guarded=p.guarded, snapshot_bytes_received=p.snapshot_bytes_received, leader=p.leader,
                               log_index_term=p.log_index_term, last_log_index=p.last_log_index,
                               last_log_term=p.last_log_term,
                               base=[pb.LogEntry(command=c, index=i, term=t) for c, i, t in p.base])

    async def Checkpoint(self, request: pb.ReplicaRequest, context):
        await self._gate.admit(context, Request.admin("checkpoint"))
        chunks = await self._opened(request, context, lambda: self._replicas.checkpoint(request.group))
        async for chunk in self._counted(request.group, chunks, context):
            yield chunk

    async def CheckpointFiles(self, requests, context):
        """Checkpoint's for a backup: the listing first, then only the files the caller names."""
        await self._gate.admit(context, Request.admin("checkpoint"))
        first = await _next_request(requests, context)
        if first is None:
            return
        request = first.replica

        async def wanted() -> list[str]:
            return list(then.paths) if (then := await _next_request(requests, context)) else []  # []: it left

        chunks = await self._opened(request, context, lambda: self._replicas.backup_checkpoint(request.group, wanted))
        async for chunk in self._counted(request.group, chunks, context):
            yield chunk

    async def _opened(self, request: pb.ReplicaRequest, context, open_chunks: Callable[[], AsyncIterator]):
        """The chunks of this node's voter of the partition, after a read barrier if asked; the call
        fails when there is no voter here, or it is not the leader."""
        voter = self._voters.get(request.group)
        if voter is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"{self._node_id} holds no voter of partition {request.group}")
        try:
            if request.linearizable:
                await voter.barrier()  # not the leader (the error names it), or no quorum
            return open_chunks()
        except RaftKVError as error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(error), trailing_metadata=error_metadata(error))

    @staticmethod
    async def _counted(group: int, chunks: AsyncIterator[pb.CheckpointChunk],
                       context) -> AsyncIterator[pb.CheckpointChunk]:
        sent = metrics.CHECKPOINT_BYTES_SENT.labels(group)
        try:
            async for chunk in chunks:
                sent.inc(len(chunk.data))
                yield chunk
        except RaftKVError as error:  # a full disk taking the checkpoint: the caller asks another voter
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(error), trailing_metadata=error_metadata(error))

    async def ChangeMembership(self, request: pb.ChangeMembershipRequest, context) -> pb.ChangeMembershipResponse:
        await self._gate.admit(context, Request.admin("change_membership"))
        try:
            answer = await self._replicas.change_membership(request.group, request.node, request.action == "add")
        except ChangeRefused as refused:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(refused))
        return _response(answer)

    async def TransferLeadership(self, request: pb.TransferLeadershipRequest, context) -> pb.ChangeMembershipResponse:
        await self._gate.admit(context, Request.admin("transfer_leadership"))
        try:
            return _response(self._replicas.transfer_leadership(request.group, request.node))
        except ChangeRefused as refused:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(refused))

    async def Compact(self, request: pb.ReplicaRequest, context) -> pb.ChangeMembershipResponse:
        await self._gate.admit(context, Request.admin("compact"))
        return _response(self._replicas.compact(request.group))

    async def Reseed(self, request: pb.ReplicaRequest, context) -> pb.ChangeMembershipResponse:
        await self._gate.admit(context, Request.admin("reseed"))
        return _response(self._replicas.reseed(request.group))

    async def NodeReport(self, request: pb.NodeReportRequest, context) -> pb.NodeReportResponse:
        await self._gate.admit(context, Request.admin("status"))
        return self._report()

    async def ReportStop(self, request: pb.StopReport, context) -> pb.StopAck:
        await self._gate.admit(context, Request.admin("report_stop"))  # nodes only, and admins
        self._stops.heard(request.node, request.reason)
        return pb.StopAck()


async def _next_request(requests, context) -> pb.CheckpointFilesRequest | None:
    """The next message of a request stream, None when it ended; a message that does not parse ends the
    call with INVALID_ARGUMENT (a stream's messages are parsed as the handler reads them)."""
    try:
        return await anext(requests, None)
    except DecodeError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a CheckpointFilesRequest: {exc}")


def _response(answer: Answer) -> pb.ChangeMembershipResponse:
    return pb.ChangeMembershipResponse(done=answer.done, leader=answer.leader)
