"""A replica seeded from a checkpoint catches up from the leader's log, against real pysyncobj members."""

from __future__ import annotations

import asyncio
import shutil

from prometheus_client import REGISTRY

from raftkv.core.spec import Tuning
from raftkv.dev.local_cluster import free_port_block
from raftkv.raft.group import Outcome, Role
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup
from raftkv.raft.syncobj_seed import seed
from tests.loopback_hubs import LoopbackHubs
from tests.raft_scenarios import DictStateMachine
from tests.test_snapshot_writer import until

VALUE = "x" * 1000
PARTITION = 7  # this test's own metric series


def raft_bytes_sent(partition: int, kind: str) -> float:
    """What this process's Raft sent of `partition` so far ("entries" or "snapshot"), from its metrics."""
    return REGISTRY.get_sample_value("raftkv_raft_bytes_sent_total", {"partition": str(partition), "kind": kind}) or 0


def _sent(kind: str) -> float:
    return raft_bytes_sent(PARTITION, kind)


def test_a_replica_seeded_from_a_checkpoint_gets_only_the_entries_after_it_and_a_stale_seed_a_snapshot(tmp_path):
    async def scenario():
        loop = asyncio.get_running_loop()
        port = free_port_block(3)
        addresses = [f"127.0.0.1:{port + i}" for i in range(3)]
        hubs = LoopbackHubs(group=PARTITION)
        hubs.know(*addresses)
        machines = {a: DictStateMachine() for a in addresses}
        groups = {a: SyncObjGroup(GroupConfig(partition=PARTITION, hub=hubs.hub(a), self_address=a,
                                              peers=tuple(p for p in addresses if p != a), folder=tmp_path / f"n{i}",
                                              fsync=False, tuning=Tuning(), membership_changes=True),
                                  machines[a], loop) for i, a in enumerate(addresses)}

        async def put(group: SyncObjGroup, key: str) -> None:
            done = loop.create_future()
            group.propose(f"{key}={VALUE}".encode(), lambda result, o: done.set_result(o))
            assert await asyncio.wait_for(done, 20) == Outcome.APPLIED

        def learner(name: str, checkpoint) -> tuple[SyncObjGroup, DictStateMachine]:
            folder = tmp_path / name
            staging = tmp_path / f".copy-{name}"
            shutil.copytree(checkpoint, staging / "db")
            seed(staging, folder, PARTITION, position, base, addresses)
            assert not staging.exists() and (folder / "db" / "state.json").exists()  # moved, not copied
            machine = DictStateMachine.at(folder / "db")
            return SyncObjGroup(GroupConfig(partition=PARTITION, hub=hubs.hub(None), self_address=None,
                                            peers=tuple(addresses),
                                            folder=folder, fsync=False, tuning=Tuning(), membership_changes=True),
                                machine, loop), machine

        opened = []
        try:
            await until(lambda: sum(g.role == Role.LEADER for g in groups.values()) == 1)
            leader = next(g for g in groups.values() if g.role == Role.LEADER)
            for i in range(50):
                await put(leader, f"before-{i}")
            leader_machine = next(machines[a] for a, g in groups.items() if g is leader)
            position = leader_machine.position
            checkpoint = tmp_path / "checkpoint"
            assert leader_machine.checkpoint(checkpoint, position) == position
            base = leader.log_base_at(position.index)
            for i in range(20):
                await put(leader, f"after-{i}")

            entries, snapshots = _sent("entries"), _sent("snapshot")
            seeded, machine = learner("seeded", checkpoint)
            opened.append(seeded)
            await until(lambda: machine.data == leader_machine.data)
            assert _sent("snapshot") == snapshots
            # its log starts with the group's real entries, which it would send a follower were it to lead
            assert seeded.log_base_at(position.index) == base and base[1][0] != bytes([1])  # not a no-op
            assert 20 * len(VALUE) <= _sent("entries") - entries < 30 * len(VALUE)  # the 20 after, not the 50 before

            leader.compact()  # past the checkpoint: a replica seeded with it now gets the leader's snapshot
            await until(lambda: leader.log_entries <= 2)
            snapshots = _sent("snapshot")
            stale, machine = learner("stale", checkpoint)
            opened.append(stale)
            await until(lambda: machine.data == leader_machine.data)
            assert _sent("snapshot") > snapshots
        finally:
            for g in list(groups.values()) + opened:
                g.close()
            await hubs.close()

    asyncio.run(scenario())
