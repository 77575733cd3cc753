"""The in-memory Raft twin: Raft's safety properties under random faults, and what the scenarios rely on."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from raftkv.raft.group import Outcome, Role
from raftkv.raft.memory_group import Disk, MemoryGroup
from raftkv.raft.memory_network import MemoryNetwork
from tests.raft_scenarios import DictStateMachine, TwinDriver, run

NAMES = ["n1", "n2", "n3", "n4", "n5"]


class Cluster:
    def __init__(self, tmp_path, seed: int, names=NAMES[:3]):
        self.net = MemoryNetwork(seed)
        self.disks = {}
        self.machines: dict[str, DictStateMachine] = {}
        self.groups: dict[str, MemoryGroup] = {}
        for name in names:
            (tmp_path / name).mkdir()
            self.disks[name] = Disk(tmp_path / name, voters=frozenset(names))
            self.open(name)
        self.leaders_by_term: dict[int, str] = {}
        self.applied: dict[int, tuple] = {}  # index -> (term, payload) first applied there

    def open(self, name: str) -> None:
        self.machines[name] = DictStateMachine()
        self.groups[name] = MemoryGroup(name, self.disks[name], self.machines[name], self.net)

    def observe(self) -> None:
        """Election safety and state machine safety, after every step."""
        for name, group in self.groups.items():
            if not group.closed and group.role == Role.LEADER:
                assert self.leaders_by_term.setdefault(group.term, name) == name, "two leaders in one term"
            for entry in group.committed_entries(group._snapshot_index(), 10**9):
                seen = self.applied.setdefault(entry.index, (entry.term, entry.payload))
                assert seen == (entry.term, entry.payload), f"{name} applied another entry at {entry.index}"


@pytest.mark.parametrize("seed", range(40))
def test_random_crashes_and_message_loss_keep_raft_safe_and_lose_no_applied_write(tmp_path, seed):
    rng = random.Random(seed)
    cluster = Cluster(tmp_path, seed, names=NAMES[: 3 + seed % 3])
    outcomes: dict[str, Outcome] = {}
    for step in range(300):
        action = rng.random()
        name = rng.choice(sorted(cluster.groups))
        group = cluster.groups[name]
        if action < 0.3 and not group.closed and group.role == Role.LEADER:
            item = f"k{step}={seed}"
            group.propose(item.encode(), lambda result, outcome, item=item: outcomes.__setitem__(item, outcome))
        elif action < 0.35:
            group.close() if not group.closed else cluster.open(name)
        elif action < 0.4 and not group.closed:
            group.compact()
        elif action < 0.5:  # lose or reorder what is in flight
            queue = list(cluster.net.queue)
            rng.shuffle(queue)
            cluster.net.queue.clear()
            cluster.net.queue.extend(m for m in queue if rng.random() < 0.7)
        cluster.net.deliver()
        if step % 3 == 0:
            for member in cluster.groups.values():
                if not member.closed:
                    member.tick()
        cluster.observe()
    for name, group in cluster.groups.items():  # everyone back, and time to settle
        if group.closed:
            cluster.open(name)
    cluster.net.tick(200)
    cluster.observe()
    datas = {name: cluster.machines[name].data for name in cluster.groups}
    assert len({tuple(sorted(d.items())) for d in datas.values()}) == 1, datas
    for item, outcome in outcomes.items():
        key, value = item.split("=")
        assert (datas["n1"].get(key) == value) == (outcome == Outcome.APPLIED) or outcome == Outcome.UNKNOWN


def test_a_follower_behind_the_leaders_log_catches_up_through_a_snapshot(tmp_path):
    script = (Path(__file__).parent / "testdata" / "raft" / "snapshot_install.txt").read_text()
    driver = TwinDriver(tmp_path)
    assert asyncio.run(run(script, driver)) == script
    n3 = driver.members["n3"].group
    assert n3.disk.snapshot is not None and n3.disk.snapshot.path.parent == tmp_path / "n3"


def test_an_uncommitted_entry_of_an_old_leader_is_truncated_when_it_returns(tmp_path):
    cluster = Cluster(tmp_path, seed=0)
    n1 = cluster.groups["n1"]
    n1.campaign()
    cluster.net.stabilize()
    cluster.groups["n2"].close()
    cluster.groups["n3"].close()
    outcome = []
    n1.propose(b"x=9", lambda result, o: outcome.append(o))
    appended = n1.last_log_index
    assert n1._entry(appended).data == b"x=9"
    n1.close()
    cluster.open("n2")
    cluster.open("n3")
    cluster.groups["n2"].campaign()
    cluster.net.stabilize()
    cluster.open("n1")
    cluster.net.tick(30)
    assert cluster.groups["n1"]._entry(appended).data != b"x=9"
    assert "x" not in cluster.machines["n1"].data
    assert outcome == []  # the callback belonged to the closed member


def test_membership_changes_one_at_a_time_and_only_after_the_leader_committed_its_own_entry(tmp_path):
    (tmp_path / "n4").mkdir()
    cluster = Cluster(tmp_path, seed=0)
    n1 = cluster.groups["n1"]
    n1.campaign()  # its no-op is appended but not committed until the others answer
    answers = []
    n1.add_member("n4", lambda result, o: answers.append(o))
    assert answers == [Outcome.REJECTED]
    cluster.net.stabilize()
    cluster.disks["n4"] = Disk(tmp_path / "n4", voters=frozenset(["n1", "n2", "n3"]))
    cluster.open("n4")
    n1.add_member("n4", lambda result, o: answers.append(o))
    n1.remove_member("n3", lambda result, o: answers.append(o))  # the add is still in flight
    assert answers == [Outcome.REJECTED, Outcome.REJECTED]
    cluster.net.tick(5)
    assert answers == [Outcome.REJECTED, Outcome.REJECTED, Outcome.APPLIED]
    assert n1.voters == {"n1", "n2", "n3", "n4"}
