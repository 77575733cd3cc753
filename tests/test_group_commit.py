"""PartitionFrontend's decisions that need no cluster (group commit itself is tested through real nodes)."""

from __future__ import annotations

import asyncio

import pytest

from raftkv.core.command_kinds import GUARDED_BATCH_SINCE
from raftkv.core.commands import Guard, GuardedBatch, Put
from raftkv.core.errors import StorageFull, Unavailable
from raftkv.node.group_commit import PartitionFrontend
from raftkv.raft.group import Role


class FullLeader:
    """A leading replica whose disk is full."""

    partition = 0
    role = Role.LEADER
    leader_address = None
    storage_full = True

    def __init__(self):
        self.stepped_aside = 0
        self.proposed = 0

    def step_aside(self, now: float) -> None:
        self.stepped_aside += 1

    def propose(self, payload, callback) -> None:
        self.proposed += 1


def test_a_leader_with_a_full_disk_refuses_at_once_and_steps_aside():
    """Found by the chaos harness: such a leader proposed anyway, its journal lost the entry, and every
    write to its partitions waited out the request timeout as Undetermined while it kept leading."""

    async def scenario(replica: FullLeader) -> None:
        frontend = PartitionFrontend(replica, asyncio.get_running_loop(), max_batch_ops=10, max_batch_bytes=1 << 20,
                                     request_timeout=10.0, leader_id_of=lambda address: None)
        with pytest.raises(StorageFull, match="disk is full"):
            await frontend.submit(Put(b"k", b"v"))
        with pytest.raises(StorageFull):
            await frontend.barrier()  # a linearizable read needs a log entry too

    replica = FullLeader()
    asyncio.run(scenario(replica))
    assert replica.stepped_aside == 2 and replica.proposed == 0


def test_a_guarded_batch_is_not_logged_before_every_node_can_apply_it():
    """A 0.2 node fails on the log tag of a guarded batch: the leader must not log one during an upgrade."""

    class Leader(FullLeader):
        storage_full = False

    async def scenario(replica: Leader, cluster_version: str) -> None:
        frontend = PartitionFrontend(replica, asyncio.get_running_loop(), max_batch_ops=10, max_batch_bytes=1 << 20,
                                     request_timeout=10.0, leader_id_of=lambda address: None,
                                     cluster_version=lambda: cluster_version)
        command = GuardedBatch((Guard(b"k", None),), (Put(b"k", b"v"),))
        if cluster_version == "0.2.0":
            with pytest.raises(Unavailable, match=r"needs every node at 0\.3\.0\.dev0 or later, and the cluster "
                                                  r"version is 0\.2\.0"):
                await frontend.submit(command)
        else:
            frontend.submit(command)
            await asyncio.sleep(0)

    before, after = Leader(), Leader()
    asyncio.run(scenario(before, "0.2.0"))
    asyncio.run(scenario(after, GUARDED_BATCH_SINCE))
    assert (before.proposed, after.proposed) == (0, 1)


def test_a_closed_frontend_refuses_at_once_what_its_closed_group_would_never_answer():
    """A soak: a write that came in while its node stopped went to the partition's closed Raft group, which
    never answers, and waited for the commit timeout past the server's grace on stopping: grpc cancelled
    the call and logged a traceback."""

    class ClosedLeader(FullLeader):
        storage_full = False

        def close(self) -> None:
            pass

    async def scenario(replica: ClosedLeader) -> None:
        frontend = PartitionFrontend(replica, asyncio.get_running_loop(), max_batch_ops=10, max_batch_bytes=1 << 20,
                                     request_timeout=10.0, leader_id_of=lambda address: None)
        frontend.close()
        for call in (lambda: frontend.submit(Put(b"k", b"v")), frontend.barrier):
            with pytest.raises(Unavailable, match="its replica here is closed"):
                await asyncio.wait_for(call(), 1.0)

    replica = ClosedLeader()
    asyncio.run(scenario(replica))
    assert replica.proposed == 0
