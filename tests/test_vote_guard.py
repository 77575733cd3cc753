"""A voter that lost its data waits to learn what was committed before it votes (raftkv/raft/vote_guard.py)."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from raftkv import Client, RaftKVError
from raftkv.chaos.netcut import NetCut
from raftkv.core.errors import CorruptData, DiskFailed
from raftkv.raft.vote_guard import FLOOR_FILE, VoteFloor, VoteGuard, VoterAnswer, answers_needed, floor_from
from tests.conftest import wait_until
from tests.raft_admin import leader_of


def test_a_guard_waits_for_its_floor_then_admits_only_later_terms_and_logs_as_up_to_date(tmp_path):
    guard = VoteGuard(tmp_path, guarded=True)
    assert guard.waiting and guard.refusal(99, 99, 10**9) and guard.held_back(99, 10**9)
    guard.settle(VoteFloor(term=7, index=120, log_term=6))
    assert guard.refusal(7, 7, 500)  # it may have voted in term 7 before it lost its data
    assert guard.refusal(8, 6, 119)  # a candidate without every committed entry
    assert guard.refusal(8, 5, 900)  # a longer log of an earlier term: a deposed leader's
    assert guard.refusal(8, 6, 120) is None and guard.refusal(8, 7, 2) is None
    assert guard.held_back(6, 119) and guard.held_back(6, 120) is None
    reopened = VoteGuard(tmp_path, guarded=True)  # a restart before it caught up keeps the floor
    assert not reopened.waiting and reopened.floor == VoteFloor(7, 120, 6)
    assert VoteGuard(tmp_path / "fresh", guarded=False).refusal(1, 0, 0) is None


def test_a_restart_before_the_floor_is_learned_still_waits(tmp_path):
    """Found by the simulation's `wipe` fault: the node opens a replica guarded when its folder is empty,
    and a restart finds it holding files; before the guard was kept from the start, that restart voted as
    a fresh replica, and a wiped pair elected one of themselves over committed entries."""
    VoteGuard(tmp_path, guarded=True)
    assert VoteGuard(tmp_path, guarded=False).waiting


def test_a_floor_needs_enough_voters_and_takes_the_most_up_to_date_log():
    """Seed 30 of the simulation: one voter's commit index was the floor, while the entries the wiped
    leader had committed were on the voter that was down."""
    behind, ahead = VoterAnswer(term=12, commit_index=282, last_log=(12, 293)), VoterAnswer(13, 290, (12, 312))
    assert [answers_needed(n) for n in (1, 2, 3, 4, 5)] == [1, 1, 2, 2, 3]
    assert floor_from([behind], voters=3) is None  # the other may hold entries committed with the wiped one
    assert floor_from([behind, ahead], voters=3) == VoteFloor(term=13, index=312, log_term=12)
    assert floor_from([behind], voters=2) == VoteFloor(12, 293, 12)
    older = VoterAnswer(13, 300, None)  # a release that does not say where its log ends
    assert floor_from([behind, older], voters=3) == VoteFloor(13, 300, None)
    wiped = VoterAnswer(14, 0, (14, 320), recovering=True)  # lost its data too: counts only once all answered
    assert floor_from([behind, wiped], voters=3) == VoteFloor(14, 320, 14)  # two disks of three replaced
    assert floor_from([behind, wiped], voters=4) is None and floor_from([wiped], voters=2) is None


def test_once_caught_up_only_the_term_part_stays_and_a_floor_no_log_holds_is_lowered(tmp_path):
    """Without either, the simulation's groups stayed leaderless for good after a power cut of every node
    in lose-last-second mode: the floor's entries were gone from every log."""
    guard = VoteGuard(tmp_path, guarded=True)
    guard.settle(VoteFloor(term=13, index=494, log_term=13))
    assert not guard.lower(VoteFloor(13, 500, 13)) and guard.floor == VoteFloor(13, 494, 13)  # never raised
    assert guard.lower(VoteFloor(term=12, index=490, log_term=13))  # the quorum's logs all end before it
    assert guard.floor == VoteFloor(13, 490, 13) and guard.recovering  # the term part never goes down
    guard.caught_up(489)
    assert guard.recovering and guard.held_back(13, 489)
    guard.caught_up(490)
    assert not guard.recovering and guard.held_back(0, 0) is None and guard.refusal(14, 0, 0) is None
    assert guard.refusal(13, 20, 900)  # it may still have voted in term 13
    assert VoteGuard(tmp_path, guarded=False).floor == VoteFloor(13, 0, 0)


def test_a_guarded_replica_takes_no_append_until_it_knows_the_term_it_forgot(tmp_path):
    """Seed 121 of the simulation: a wiped voter, back with term 0, acknowledged a deposed leader's
    appends, and that leader committed entries over ones a later leader had committed."""
    guard = VoteGuard(tmp_path, guarded=True)
    assert not guard.admits_leader(99)
    guard.settle(VoteFloor(term=4, index=47, log_term=3))
    assert not guard.admits_leader(3) and guard.admits_leader(4) and guard.admits_leader(5)


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
