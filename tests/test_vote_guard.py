"""A voter that lost its data waits to learn what was committed before it votes (raftkv/raft/vote_guard.py)."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from raftkv import Client, RaftKVError
from raftkv.chaos.netcut import NetCut
from raftkv.core.errors import CorruptData, DiskFailed
from raftkv.raft.vote_guard import FLOOR_FILE, VoteFloor, VoteGuard
from tests.conftest import wait_until
from tests.raft_admin import leader_of


def test_a_guard_waits_for_its_floor_then_admits_only_later_terms_and_full_logs(tmp_path):
    guard = VoteGuard(tmp_path, guarded=True)
    assert guard.waiting and guard.refusal(99, 10**9) and guard.held_back(10**9)
    guard.settle(VoteFloor(term=7, index=120))
    assert guard.refusal(7, 500)  # it may have voted in term 7 before it lost its data
    assert guard.refusal(8, 119)  # a candidate without every committed entry
    assert guard.refusal(8, 120) is None
    assert guard.held_back(119) and guard.held_back(120) is None
    reopened = VoteGuard(tmp_path, guarded=True)  # a restart before it caught up keeps the floor
    assert not reopened.waiting and reopened.floor == VoteFloor(7, 120)
    assert VoteGuard(tmp_path / "fresh", guarded=False).refusal(1, 0) is None


def test_an_unreadable_or_damaged_floor_stops_the_replica_with_one_line(tmp_path):
    (tmp_path / FLOOR_FILE).mkdir()  # reading it fails as a failing disk's read does (an OSError)
    with pytest.raises(DiskFailed, match="is unreadable"):
        VoteGuard(tmp_path, guarded=True)
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / FLOOR_FILE).write_text("{")
    with pytest.raises(CorruptData, match="is corrupt"):
        VoteGuard(damaged, guarded=True)


def _wipe_all(cluster, node_id: str) -> None:
    """Everything the node had, as a replaced disk leaves it (its log aside)."""
    for item in cluster.spec.node(node_id).data_dir.iterdir():
        if item.name != "node.log":
            shutil.rmtree(item) if item.is_dir() else item.unlink()


def test_two_wiped_voters_do_not_elect_each_other_over_the_one_that_has_the_writes(make_cluster):
    """Found by a one-minute chaos run of corrupt files: two of three voters were wiped close together,
    came back with empty logs and no memory of their votes, and elected one of themselves while the
    third, which held the acknowledged writes, still led in a higher term; what the impostor
    acknowledged was lost. Here the third stays up and reachable through its API, but its Raft traffic
    to the other two is cut: before the fix they elected each other within a second and took a write."""
    cluster = make_cluster(nodes=3, partitions=1, replication=3, start=False)
    net = NetCut(cluster.spec, name=f"raftkv_test_guard_{os.getpid()}")
    cluster.wrap_command = net.command_for
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=60)
        written = {b"k%03d" % i: b"v%d" % i for i in range(50)}
        with Client(cluster.endpoints, timeout=10) as kv:
            for key, value in written.items():
                kv.put(key, value)
        keeper = leader_of(cluster.endpoints)
        wiped = [n for n in cluster.spec.node_ids if n != keeper]
        for node_id in wiped:
            cluster.stop(node_id)
            _wipe_all(cluster, node_id)
        net.cut([(keeper,), tuple(wiped)])
        for node_id in wiped:
            cluster.start(node_id)
        others = [cluster.spec.node(n).api_address for n in wiped]
        time.sleep(3.0)  # several election timeouts: long enough for the two to elect each other
        with Client(others, timeout=2) as kv:
            with pytest.raises(RaftKVError):
                kv.put(b"impostor", b"1")
        assert leader_of(others) is None
        net.heal()
        with Client(cluster.endpoints, timeout=10) as kv:
            wait_until(lambda: _writes(kv), 30, "the partition to take writes again")
            assert {key: kv.get(key) for key in written} == written
    finally:
        cluster.stop_all()
        net.close()


def _writes(kv: Client) -> bool:
    try:
        kv.put(b"after", b"1")
        return True
    except RaftKVError:
        return False
