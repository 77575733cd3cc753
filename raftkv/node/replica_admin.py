"""The replica verbs a move uses (`ports.ReplicaAdminPort`), on this node's replicas: its voters, the
learners and copies of moves here, and its member of the metadata group."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Awaitable, Callable, Iterable

from raftkv.api import kv_pb2 as pb
from raftkv.backup.digests import FileDigests
from raftkv.core.errors import ChangeRefused, Unavailable
from raftkv.meta.records import META, ClusterMeta
from raftkv.node.backup_checkpoint import backup_checkpoint
from raftkv.node.hosted_replicas import HostedReplicas
from raftkv.node.meta_replica import MetaReplica
from raftkv.node.mover import RPC_TIMEOUT
from raftkv.node.ports import Answer, ReplicaProgress
from raftkv.node.replica import Replica
from raftkv.node.replica_copy import checkpoint_chunks
from raftkv.raft.group import Outcome, Role


class ReplicaAdmin:
    """`meta()`: this node's member of the metadata group (reopened when it becomes a voter or stops
    being one)."""

    def __init__(self, node_id: str, hosted: HostedReplicas, meta: Callable[[], MetaReplica],
                 topology: Callable[[], ClusterMeta]):
        self._me = node_id
        self._hosted = hosted
        self._meta = meta
        self._topology = topology
        self._digests: dict[int, FileDigests] = {}  # partition -> the hashes of its table files, for backups

    def progress(self, group: int, log_index: int) -> ReplicaProgress:
        hosted, g = self._hosted, group
        if g == META:
            meta = self._meta()
            replica, mode = meta, "voter" if meta.voting else "learner"
        elif g in hosted.frontends:
            replica, mode = hosted.frontends[g].replica, "voter"
        elif g in hosted.learning:
            replica, mode = hosted.learning[g], "learner"
        elif g in hosted.copying:
            return ReplicaProgress("copying", snapshot_bytes_received=hosted.copying[g].received)
        else:
            return ReplicaProgress("none")
        raft = replica.group
        guard = hosted.lost_data.guards.get(g)
        last = raft.last_log_index
        return ReplicaProgress(mode, applied_index=raft.last_applied, commit_index=raft.commit_index, term=raft.term,
                               guarded=guard is not None and guard.recovering,
                               last_log_index=last, last_log_term=raft.term_at(last) or 0,
                               snapshot_bytes_received=raft.snapshot_bytes_received,
                               leader=hosted.node_at(g, replica.leader_address) or "",
                               log_index_term=(log_index and raft.term_at(log_index)) or 0,
                               base=tuple((log_index and raft.log_base_at(log_index)) or ()))

    def _leading(self, g: int, node_id: str) -> tuple[Replica, Callable[[], Awaitable], str] | Answer:
        """The group's replica, its barrier and `node_id`'s Raft address in it, when this node leads the
        group; else the answer that says who does."""
        if g == META:
            meta = self._meta()
            replica, barrier = meta, meta.barrier
        elif g in self._hosted.frontends:
            frontend = self._hosted.frontends[g]
            replica, barrier = frontend.replica, frontend.barrier
        else:
            return Answer(done=False)
        if replica.role != Role.LEADER:
            return Answer(done=False, leader=self._hosted.node_at(g, replica.leader_address) or "")
        return replica, barrier, self._topology().node(node_id).raft_address(g)

    async def change_membership(self, group: int, node_id: str, add: bool) -> Answer:
        leading = self._leading(group, node_id)
        if isinstance(leading, Answer):
            return leading
        replica, barrier, address = leading
        if (address in replica.group.voters) == add:
            # A change counts from when it is appended, so "already a member" may still be uncommitted
            # (and undone by a new leader): an entry committed after it commits it too.
            try:
                await asyncio.wait_for(barrier(), RPC_TIMEOUT)
            except Exception:
                return Answer(done=False)
            return Answer(done=True, leader=self._me)
        if not add and node_id == self._me:
            replica.group.transfer_leadership()  # a leader cannot remove itself; the next one will
            return Answer(done=False)
        change = replica.group.add_member if add else replica.group.remove_member
        try:
            outcome = await asyncio.wait_for(_outcome_of(change, address), RPC_TIMEOUT)
        except asyncio.TimeoutError:
            outcome = Outcome.UNKNOWN
        return Answer(done=outcome == Outcome.APPLIED, leader=self._me)

    def transfer_leadership(self, group: int, node_id: str) -> Answer:
        voter = self._hosted.frontends.get(group)
        if node_id == self._me and voter is not None and voter.is_leader:
            return Answer(done=True, leader=self._me)
        leading = self._leading(group, node_id)
        if isinstance(leading, Answer):
            return leading
        replica, _, address = leading
        if address not in replica.group.voters:
            raise ChangeRefused(f"{node_id} holds no replica of partition {group}; leadership goes only to a voter")
        replica.group.transfer_leadership(address)  # best effort: the new leader shows in Status when it took over
        return Answer(done=True, leader=self._me)

    def compact(self, group: int) -> Answer:
        voter = self._hosted.frontends.get(group)
        if voter is None or not voter.is_leader:
            hint = voter.not_leader().leader_hint if voter is not None else None
            return Answer(done=False, leader=hint or "")
        voter.replica.maybe_compact(time.monotonic(), eager=True)  # a request's edge: the clock is read here
        return Answer(done=True, leader=self._me)

    def checkpoint(self, group: int) -> AsyncIterator[pb.CheckpointChunk]:
        voter = self._hosted.frontends.get(group)
        if voter is None:  # it left since the caller looked
            raise Unavailable(f"{self._me} no longer holds a voter of partition {group}")
        return checkpoint_chunks(voter.replica)

    def backup_checkpoint(self, group: int,
                          wanted: Callable[[], Awaitable[Iterable[str]]]) -> AsyncIterator[pb.CheckpointChunk]:
        voter = self._hosted.frontends.get(group)
        if voter is None:  # it left since the caller looked
            raise Unavailable(f"{self._me} no longer holds a voter of partition {group}")
        return backup_checkpoint(voter.replica, self._digests.setdefault(group, FileDigests()), wanted)

    def reseed(self, group: int) -> Answer:
        return Answer(done=self._hosted.reseed(group), leader=self._me)


def _outcome_of(change: Callable, address: str) -> asyncio.Future:
    """The outcome of a membership change (REJECTED while another is in flight, or before the leader's
    first entry of its term is committed: the Raft adapter's guard, docs/elasticity.md §3)."""
    future = asyncio.get_running_loop().create_future()
    change(address, lambda _result, outcome: future.done() or future.set_result(outcome))
    return future
