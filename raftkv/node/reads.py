"""The read path of a node (`ports.ReadPort`): which reads a replica here answers, what a read waits for
at each consistency level (docs/architecture.md, "Read path"), and what it sees. A change to how reads
are served (leases, follower reads from learners) is a change to this module."""

from __future__ import annotations

import asyncio
from typing import Iterator, Mapping

from raftkv.api import kv_pb2 as pb
from raftkv.core.learner_registry import learner_names, learners_from
from raftkv.node.group_commit import PartitionFrontend
from raftkv.node.ports import VoterStatus
from raftkv.storage.engine import KeyRange, Position


class LocalReads:
    """Reads from the replicas in `voters`: a node's voters (`HostedReplicas.frontends`, kept up to date
    there), or a learner process's copies."""

    def __init__(self, voters: Mapping[int, PartitionFrontend]):
        self._voters = voters

    def holds(self, partition: int) -> bool:
        return partition in self._voters

    def serves(self, partition: int, consistency: int) -> bool:
        voter = self._voters.get(partition)
        return voter is not None and (voter.is_leader or consistency == pb.FOLLOWER)

    async def get(self, partition: int, key: bytes, consistency: int) -> tuple[bytes | None, int]:
        voter = self._voters[partition]
        if (wait := _wait(voter, consistency)) is not None:
            await wait
        replica = voter.replica
        return replica.engine.get(key), replica.applied_index

    async def scan(self, partition: int, key_range: KeyRange,
                   consistency: int) -> tuple[Position, Iterator[tuple[bytes, bytes]]]:
        voter = self._voters[partition]
        if (wait := _wait(voter, consistency)) is not None:
            await wait
        replica = voter.replica
        applied = replica.applied_position  # nothing applies between these two lines
        _, items = replica.engine.scan(key_range)
        return applied, items

    def statuses(self) -> list[VoterStatus]:
        statuses = []
        for p, voter in sorted(self._voters.items()):
            r = voter.replica
            statuses.append(VoterStatus(
                partition=p, role=r.role.label, leader=voter.not_leader().leader_hint or "", term=r.group.term,
                commit_index=r.group.commit_index, applied_index=r.applied_index,
                last_log_index=r.group.last_log_index, has_quorum=r.group.has_quorum,
                last_data_index=r.last_data_index, learners=tuple(learners_from(r.engine.meta_items()).values()),
                members=voter.member_ids()))
        return statuses

    def leaderships(self) -> list[tuple[int, int]]:
        return [(p, voter.replica.group.term) for p, voter in sorted(self._voters.items()) if voter.is_leader]

    def learner_names(self) -> set[str]:
        return set().union(*(learner_names(voter.replica.engine.meta_items()) for voter in self._voters.values()))


def _wait(voter: PartitionFrontend, consistency: int) -> asyncio.Future | None:
    """What a read at `consistency` waits for before it is answered from `voter`'s state (None: nothing):
    a linearizable read a barrier (once it is applied here, so is every write acknowledged before the
    read); a leader read nothing, on a replica that believes it leads (NotLeader elsewhere); a follower
    read nothing. Not a coroutine: a read that waits for nothing costs none."""
    if consistency == pb.LINEARIZABLE:
        return voter.barrier()
    if consistency == pb.LEADER and not voter.is_leader:
        raise voter.not_leader()
    return None
