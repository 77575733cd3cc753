"""PartitionFrontend's decisions that need no cluster (group commit itself is tested through real nodes)."""

from __future__ import annotations

import asyncio

import pytest

from raftkv.core.commands import Put
from raftkv.core.errors import StorageFull
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
