"""The replica verbs of `Admin` (`replica_admin.ReplicaAdmin`) on the twins: a node's hosted replicas
holding a `PartitionReplica` over `MemoryEngine` under a `MemoryGroup`, one event loop, no node process,
no sockets (the topology's Raft addresses only name the twin's members)."""

from __future__ import annotations

import asyncio

import pytest

from raftkv.core.commands import Put
from raftkv.core.errors import ChangeRefused
from raftkv.core.spec import Tuning, build_spec
from raftkv.meta.bootstrap import spec_meta
from raftkv.node.group_commit import PartitionFrontend
from raftkv.node.hosted_replicas import HostedReplicas
from raftkv.node.lost_data import LostData
from raftkv.node.peers import Peers
from raftkv.node.ports import Answer
from raftkv.node.replica import PartitionReplica
from raftkv.node.replica_admin import ReplicaAdmin
from raftkv.raft.group import Role
from raftkv.raft.memory_group import Disk, MemoryGroup
from raftkv.raft.memory_network import MemoryNetwork
from raftkv.storage.engine import MemoryEngine
from tests.test_snapshot_writer import until


def test_membership_leadership_and_compaction_verbs_on_the_leader_of_a_twin_group(tmp_path):
    spec = build_spec(nodes=4, partitions=1, replication=2, base_port=30000, data_dir=tmp_path)
    topology = spec_meta(spec)
    address = {n.id: n.raft_address(0) for n in topology.nodes}
    net = MemoryNetwork(seed=2)

    def node_at(group: int, raft_address: str | None) -> str | None:
        return next((n.id for n in topology.nodes if n.raft_address(group) == raft_address), None)

    def replica(node_id: str) -> PartitionReplica[MemoryEngine]:
        disk = Disk(tmp_path / node_id, voters=frozenset({address["n1"], address["n2"]}))
        disk.folder.mkdir()
        return PartitionReplica(0, MemoryEngine(), Tuning(),
                                open_group=lambda sm: MemoryGroup(address[node_id], disk, sm, net))

    async def scenario():
        loop = asyncio.get_running_loop()
        n1, _n2, n3 = replica("n1"), replica("n2"), replica("n3")  # n3 follows as a learner until added
        n1.group.campaign()
        net.stabilize()
        assert n1.role == Role.LEADER
        peers = Peers(lambda node_id: topology.node(node_id).api_address, tls=None)
        hosted = HostedReplicas(spec, "n1", lambda: topology, peers,
                                LostData(tmp_path, "n1", peers, lambda: topology, lambda error: None), None,
                                node_at, on_corrupt=lambda error: None, on_change=lambda: None)
        hosted.frontends[0] = PartitionFrontend(n1, loop, max_batch_ops=1, max_batch_bytes=1 << 20,
                                                request_timeout=5.0, leader_id_of=lambda a: node_at(0, a))
        admin = ReplicaAdmin("n1", hosted, meta=lambda: None, topology=lambda: topology)

        async def tick():
            while True:
                net.tick()
                await asyncio.sleep(0.001)

        ticking = asyncio.ensure_future(tick())
        try:
            assert (admin.progress(0, 0).mode, admin.progress(0, 0).leader, admin.progress(5, 0).mode) == (
                "voter", "n1", "none")
            with pytest.raises(ChangeRefused, match="leadership goes only to a voter"):
                admin.transfer_leadership(0, "n3")
            with pytest.raises(ChangeRefused, match="'n9' is not in the cluster"):
                await admin.change_membership(0, "n9", add=True)

            assert await admin.change_membership(0, "n3", add=True) == Answer(done=True, leader="n1")
            assert n1.group.voters == {address["n1"], address["n2"], address["n3"]}
            assert await admin.change_membership(0, "n3", add=True) == Answer(done=True, leader="n1")  # made already
            await asyncio.gather(*(hosted.frontends[0].submit(Put(b"k%03d" % i, b"v")) for i in range(100)))
            assert admin.compact(0) == Answer(done=True, leader="n1")
            await until(lambda: n1.group.disk.snapshot is not None)

            assert await admin.change_membership(0, "n1", add=False) == Answer(done=False)  # it hands leadership on
            await until(lambda: n1.role != Role.LEADER and n1.group.leader is not None)
            successor = node_at(0, n1.group.leader)
            assert successor in ("n2", "n3")
            assert admin.compact(0) == Answer(done=False, leader=successor)
            assert await admin.change_membership(0, "n3", add=False) == Answer(done=False, leader=successor)
            assert n3.group.voters == n1.group.voters
        finally:
            ticking.cancel()
            await peers.close()

    asyncio.run(scenario())
