"""A voter's replica (`PartitionReplica`) on the twins: `MemoryEngine` under the in-memory Raft group, in
one process with no threads, files only for the snapshots."""

from __future__ import annotations

from pathlib import Path

from raftkv.core.commands import Command, LearnerProgress, Put, RegisterLearner
from raftkv.core.learner_registry import learners_from
from raftkv.core.log_codec import encode_proposal
from raftkv.core.spec import Tuning
from raftkv.node.replica import PartitionReplica
from raftkv.raft.group import Outcome, Role
from raftkv.raft.memory_group import Disk, MemoryGroup
from raftkv.raft.memory_network import MemoryNetwork
from raftkv.storage.engine import ZERO, KeyRange, MemoryEngine

NAMES = ("n1", "n2", "n3")


class Twins:
    """A group of three voters, each a `PartitionReplica` over its own `MemoryEngine`."""

    def __init__(self, folder: Path, tuning: Tuning = Tuning()):
        self.folder = folder
        self.tuning = tuning
        self.net = MemoryNetwork(seed=1)
        self.disks = {}
        for name in NAMES:
            (folder / name).mkdir()
            self.disks[name] = Disk(folder / name, voters=frozenset(NAMES))
        self.replicas: dict[str, PartitionReplica[MemoryEngine]] = {}

    def start(self, name: str) -> PartitionReplica[MemoryEngine]:
        disk, net = self.disks[name], self.net
        replica = PartitionReplica(0, MemoryEngine(), self.tuning,
                                   open_group=lambda sm: MemoryGroup(name, disk, sm, net))
        self.replicas[name] = replica
        return replica

    def put(self, leader: PartitionReplica, *keys: bytes) -> None:
        self.propose(leader, *([Put(key, b"v-" + key)] for key in keys))

    def propose(self, leader: PartitionReplica, *entries: list[Command]) -> None:
        outcomes = []
        for commands in entries:
            leader.propose(encode_proposal(commands), lambda _result, outcome: outcomes.append(outcome))
        self.net.stabilize()
        self.net.tick()  # the followers learn of the commit with the next heartbeat
        assert outcomes == [Outcome.APPLIED] * len(entries)


def items(replica: PartitionReplica) -> list[tuple[bytes, bytes]]:
    return list(replica.engine.scan(KeyRange())[1])


def test_a_replica_that_missed_the_compacted_log_catches_up_from_the_snapshot_of_a_memory_engine(tmp_path):
    twins = Twins(tmp_path)
    leader, follower = twins.start("n1"), twins.start("n2")
    leader.group.campaign()
    twins.net.stabilize()
    assert leader.role == Role.LEADER
    twins.put(leader, b"a", b"b", b"c")
    leader.group.compact()
    twins.put(leader, b"d")
    assert leader.group.disk.snapshot is not None and leader.group.disk.snapshot.last.index < leader.applied_index

    late = twins.start("n3")  # its log starts after the snapshot: it can only install it
    twins.net.tick(3)

    assert items(late) == items(leader) == [(k, b"v-" + k) for k in (b"a", b"b", b"c", b"d")]
    assert late.applied_position == leader.applied_position == follower.applied_position
    assert late.last_data_index == leader.last_data_index == leader.applied_index


def test_a_move_catching_up_holds_the_log_as_a_learner_behind_does_until_the_retention_bound(tmp_path):
    """A move's target seeds from a voter's checkpoint and catches up from the log after it; the leader
    compacting meanwhile sent it a full snapshot on top of the copy (bench_move: 115 MB more)."""
    twins = Twins(tmp_path, Tuning(compaction_min_entries=3, learner_retention_entries=12))
    leader, _ = twins.start("n1"), twins.start("n2")
    leader.group.campaign()
    twins.net.stabilize()
    twins.put(leader, *(b"k%d" % i for i in range(6)))
    leader.maybe_compact(0.0, moving_in=True)
    assert leader.group.disk.snapshot is None  # held: no learner streams yet
    twins.put(leader, *(b"k%d" % i for i in range(6, 14)))
    leader.maybe_compact(1.0, moving_in=True)  # past the retention bound: compacted all the same
    assert leader.group.disk.snapshot is not None and leader.group.log_entries <= 2
    twins.put(leader, *(b"k%d" % i for i in range(14, 20)))
    leader.maybe_compact(2.0)  # the move ended
    assert leader.group.disk.snapshot.last.index == leader.applied_index


def test_a_state_past_the_log_rolls_back_to_its_snapshot_or_to_empty_on_a_memory_engine(tmp_path):
    twins = Twins(tmp_path)
    replicas = [twins.start(name) for name in NAMES]
    leader = replicas[0]
    leader.group.campaign()
    twins.net.stabilize()
    twins.put(leader, b"a")
    twins.propose(leader, [RegisterLearner("feed", "memory")], [LearnerProgress("feed", 2)])
    leader.group.compact()
    snapshot = leader.group.disk.snapshot
    twins.put(leader, b"b")
    assert snapshot.position.index < leader.engine.position.index

    leader.state_machine.roll_back(snapshot)
    assert items(leader) == [(b"a", b"v-a")] and list(learners_from(leader.engine.meta_items())) == ["feed"]
    assert leader.engine.position == snapshot.position and leader.last_data_index == snapshot.position.index
    leader.state_machine.roll_back(None)
    assert (items(leader), leader.engine.meta_items(), leader.engine.position, leader.last_data_index) == (
        [], [], ZERO, 0)
