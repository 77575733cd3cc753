"""The deterministic simulation of pysyncobj members (tests/engine_sim/) over many seeds, in both
durability modes: Raft's safety after every step, one history and every acknowledged proposal at the
end. A failure prints the trace and the command that replays it (scripts/raft_sim.py).

About half a million steps in all, 80,000 of them with the node engine (20,000 with a learner; `make test` is near its 30
minutes; scripts/raft_sim.py runs more, `--engine` with the node engine); a group that did not settle
is a warning, not a failure (run.Result.ok).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections import Counter
from functools import partial
from pathlib import Path

import pytest

from raftkv.raft.engine import learners, steady
from raftkv.raft.engine.node_engine import NodeEngine
from raftkv.raft import syncobj_group, vote_guard
from raftkv.raft.state_repair import StateRepair
from raftkv.raft.syncobj_patches import PatchedSyncObj
from raftkv.raft.syncobj_group import SyncObjGroup
from raftkv.raft.syncobj_votes import Votes
from tests.engine_sim import cluster as sim_cluster
from tests.engine_sim import wipes as sim_wipes
from tests.engine_sim.faults import Faults
from tests.engine_sim.network import NetFaults
from tests.engine_sim.run import SimConfig, run

ROOT = Path(__file__).resolve().parents[2]


def _run_seeds(seeds, **options) -> Counter:
    """Every seed's run must be safe; returns their stats added up."""
    totals: Counter = Counter()
    for seed in seeds:
        result = run(SimConfig(seed=seed, **options))
        if not result.ok:
            pytest.fail(result.report(200), pytrace=False)
        if result.liveness:
            warnings.warn(result.report(0))
        totals.update(result.stats)
        totals["steps"] += result.steps
    return totals


@pytest.mark.parametrize("fsync", [False, True], ids=["default", "fsync"])
@pytest.mark.parametrize("nodes, groups, seeds, steps", [
    (3, 2, range(1, 7), 20_000), (5, 8, range(1, 3), 40_000), (4, 16, range(1, 2), 50_000),
], ids=["3x2", "5x8", "4x16"])
def test_raft_stays_safe_under_faults(fsync, nodes, groups, seeds, steps):
    totals = _run_seeds(seeds, steps=steps, nodes=nodes, groups=groups, fsync=fsync)
    assert totals["acknowledged"] > 0 and totals["power cuts"] > 0 and totals["kills"] > 0
    if fsync:
        assert totals["committed entries forgotten"] == 0 and totals["acknowledged lost"] == 0


def test_whole_cluster_power_cuts_in_the_default_mode_recover_to_one_history():
    """The power cut of docs/chaos.md's last rows: entries acknowledged on a majority are lost, a replica
    that kept and applied them lets the new leader replace them and rolls its state back (state_repair)."""
    totals = _run_seeds(range(1, 9), steps=20_000, faults=Faults(cluster_power=0.1))
    assert totals["committed entries forgotten"] > 0
    assert totals["rollbacks"] > 0


def test_without_the_state_repair_the_replicas_diverge(monkeypatch):
    """The check can fail: with `StateRepair.before_truncation` a no-op (a replica keeps its commit index
    and state over entries a leader replaces) the seeds below break state-machine safety."""
    monkeypatch.setattr(StateRepair, "before_truncation", lambda self, first: None)
    for seed, steps in ((28, 2_000), (68, 2_000)):
        result = run(SimConfig(seed=seed, steps=steps, faults=Faults(cluster_power=0.1)))
        assert any("state-machine safety" in line for line in result.violations), result.report(40)


def test_a_seed_replays_the_same_run_in_another_process():
    """pysyncobj walks sets of nodes in an order that differs between processes (string hashes): the
    schedule must not depend on it."""
    digests = set()
    for hash_seed in ("1", "2"):
        command = [sys.executable, "scripts/raft_sim.py", "--seed", "3", "--steps", "10000", "--nodes", "5",
                   "--groups", "8", "--digest"]
        out = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": hash_seed}, capture_output=True,
                             text=True, timeout=120, check=True).stdout
        digests.add(out.splitlines()[0])
    assert len(digests) == 1, digests


@pytest.mark.parametrize("fsync", [False, True], ids=["default", "fsync"])
def test_raft_stays_safe_with_the_node_engine_and_hand_overs_both_ways(fsync):
    """Groups' steady state through the node engine (raft_engine = "steady"), taken at proposals to settled
    leaders, rested in the engine when idle, and handed back on every fault, on a new term and at random,
    leader or follower side."""
    totals = _run_seeds(range(1, 2), steps=15_000, fsync=fsync, engine=True)
    totals += _run_seeds(range(1, 2), steps=15_000, nodes=5, groups=8, fsync=fsync, engine=True)
    assert totals["engine frames"] > 1000 and totals["forced handbacks"] > 10 and totals["acknowledged"] > 0
    assert totals["engine rests"] > 0, totals
    if fsync:
        assert totals["committed entries forgotten"] == 0 and totals["acknowledged lost"] == 0


@pytest.mark.parametrize("fsync", [False, True], ids=["default", "fsync"])
def test_raft_stays_safe_while_idle_groups_rest_in_the_engine_and_wake(fsync):
    """Few proposals (3 a second over 8 groups): groups go idle between them, and their leaders rest them in
    the engine (`rest`) and wake them with `steps`, under every fault (118 seeds clean when it was built)."""
    totals = _run_seeds(range(1, 4), steps=10_000, groups=8, fsync=fsync, engine=True, faults=Faults(proposals=3.0))
    assert totals["engine rests"] > 50 and totals["acknowledged"] > 100, totals


@pytest.mark.parametrize("fsync", [False, True], ids=["default", "fsync"])
def test_a_learner_is_fed_every_committed_entry_while_the_engine_drives(fsync):
    """A learner process (a read-only member of every even group) with the engine driving and hand-overs
    forced: it counts committed only entries the voters committed, applies the voters' history, and at the
    end holds it whole (run.check_final); most of what it learns comes while the engine leads."""
    totals = _run_seeds(range(1, 2), steps=10_000, fsync=fsync, engine=True, learners=True)
    assert totals["forced handbacks"] > 5 and totals["acknowledged"] > 0, totals
    assert totals["learner entries committed while the engine led"] > 100, totals


def test_a_learner_told_of_uncommitted_entries_is_caught(monkeypatch):
    """The learner's checks can fail: a feed that tells learners the leader's last entry is committed is
    caught in every seed tried (20 of 20, both modes, within 2,100 steps)."""
    feed = learners.LearnerFeed.feed

    def lying(self, now):
        member = self._member
        commit, member._SyncObj__raftCommitIndex = member._SyncObj__raftCommitIndex, member._SyncObj__raftLog[-1][1]
        try:
            feed(self, now)
        finally:
            member._SyncObj__raftCommitIndex = commit

    monkeypatch.setattr(learners.LearnerFeed, "feed", lying)
    result = run(SimConfig(seed=1, steps=400, fsync=True, engine=True, learners=True))  # fails at step 150
    assert any(line.startswith("learner: ") for line in result.violations), result.report(40)


def test_leaders_of_an_engine_that_does_not_offer_keep_their_groups(monkeypatch):
    """`raft_engine = "auto"` before the cluster version has the engine: the node engine runs, its leaders
    offer nothing, so no group is driven by it and every write goes pysyncobj's way."""
    monkeypatch.setattr(sim_cluster, "NodeEngine", partial(NodeEngine, offering=False))
    totals = _run_seeds(range(1, 2), steps=4_000, engine=True)
    assert totals["acknowledged"] > 0 and totals["engine frames"] == 0, totals


def test_an_engine_that_commits_without_a_quorum_is_caught(monkeypatch):
    """The checks can fail with the engine: a leader counting only itself breaks leader completeness."""
    monkeypatch.setattr(steady, "quorum_commit", lambda own_last, matches, term_at, term, commit:
                        own_last if own_last > commit and term_at(own_last) == term else commit)
    result = run(SimConfig(seed=208, steps=4_000, engine=True))
    assert any("leader completeness" in line for line in result.violations), result.report(40)


def test_a_leader_that_counts_itself_before_its_sync_is_caught(monkeypatch):
    """fsync mode: an engine leader sends its entries before its own sync. Counting itself toward their
    quorum at once, it commits and applies what only one follower synced (a power cut could take it)."""
    monkeypatch.setattr(steady.SteadyGroup, "_own_index", lambda self: self._member._SyncObj__raftLog[-1][1])
    result = run(SimConfig(seed=1, steps=1_000, groups=4, fsync=True, engine=True))
    assert any("durable quorum" in line for line in result.violations), result.report(40)


def test_a_group_handed_back_before_its_leaders_sync_is_caught(monkeypatch):
    """pysyncobj counts the leader's whole log toward every quorum: a group handed back to it before the
    entries the engine sent early were synced is committed by pysyncobj on one follower's copy."""
    monkeypatch.setattr(NodeEngine, "sync_now", lambda self: None)
    result = run(SimConfig(seed=34, steps=1_000, groups=4, fsync=True, engine=True))
    assert any("durable quorum" in line for line in result.violations), result.report(40)


def test_a_member_whose_saved_commit_index_is_past_its_log_settles():
    """Seed 109 with the engine and power cuts of every node: a member restarted with a commit index past
    its log's end (526 against 521), was elected, and asked for appends at every tick while virtual time
    stood still, so the run never ended. StateRepair.after_load now clamps it (pysyncobj does only when
    it loads a snapshot). Without the clamp this runs until the timeout."""
    command = [sys.executable, "scripts/raft_sim.py", "--seed", "109", "--steps", "20000", "--engine",
               "--cluster-power", "0.1"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "1 seeds, 0 failed, 0 did not settle" in done.stdout, done.stdout + done.stderr


def test_an_answer_to_a_predecessors_forwarded_command_is_never_taken_for_the_successors(monkeypatch):
    """fsync mode, seed 158, messages held up to 8 s in their receiver's socket (`--stale`): n1's member of
    g0 forwarded its command 1 at 20.9 s (held until 28.3), was removed at 23.2 and added back at 24.5,
    and forwarded g0.1004 as its command 1 at 26.0 (appended at 489; that answer was held too). The
    leader appended the predecessor's command at 540 and answered "1: 540", and n1 acknowledged g0.1004
    at 540, which held the other command. Command numbers now start from the clock
    (`PatchedSyncObj._requestIdsFrom`)."""
    config = SimConfig(seed=158, steps=20_000, fsync=True, engine=True, learners=True,
                       net=NetFaults(stale=0.05, stale_delay=8.0))
    assert run(config).ok
    monkeypatch.setattr(PatchedSyncObj, "_requestIdsFrom", lambda self: 0)
    assert any("is not in the settled state" in line for line in run(config).violations)


def test_a_candidate_behind_a_member_that_never_asks_it_learns_its_term_and_the_group_elects(monkeypatch):
    """Default mode, seed 1006, with `--stale` and wipes: after a cut of every node, g1's n2 (its log ending at
    an uncommitted `rem n3`, so it asked only n1) campaigned at term 123 and n1's vote guard refused its
    log; n3 (log to 153, ending at an uncommitted `rem n1`, so it asked only n2) campaigned at term 108,
    and n2 ignored requests from before its term, as pysyncobj does, without telling n3. No leader to
    the end, terms rising: partition 4's symptoms (docs/chaos.md). A member now answers such a request
    with its term (`Votes._refuse_stale_term`), which the candidate adopts (`PatchedSyncObj._adoptTerm`)."""
    config = SimConfig(seed=1006, steps=20_000, engine=True, learners=True, faults=Faults(wipe=0.1),
                       net=NetFaults(stale=0.05, stale_delay=8.0))
    result = run(config)
    assert result.ok and not result.liveness, result.report(40)
    monkeypatch.setattr(Votes, "_refuse_stale_term", lambda self, node: None)
    assert any("g1: no leader" in line for line in run(config).liveness)


def test_a_member_restarted_with_an_uncommitted_membership_change_counts_it(monkeypatch):
    """fsync mode, seed 235: every node restarted while g1's `add n5` (to n2, n3 and n4) was in the logs and
    uncommitted. pysyncobj counts a membership entry at start-up only once it applies it, so n3 led term 3
    on n2's vote alone and committed entries 8 to 10 on the two of them, two of four voters (seed 9 and 8
    more of 400 did the same). The configuration now takes every logged entry at start-up
    (`SyncObjGroup._take_logged_members`), as Raft's does."""
    config = SimConfig(seed=235, steps=1_400, nodes=5, groups=4, fsync=True, engine=True, learners=True)
    assert run(config).ok
    monkeypatch.setattr(SyncObjGroup, "_take_logged_members", lambda self: None)
    monkeypatch.setattr(syncobj_group, "membership_change", lambda command: None)  # pysyncobj replays it again
    assert any("durable quorum" in line for line in run(config).violations)


def _one_answer(monkeypatch):
    monkeypatch.setattr(vote_guard, "answers_needed", lambda voters: 1)


def _commit_index_floor(monkeypatch):
    def floor_from(answers, voters):
        if not answers or len(answers) < vote_guard.answers_needed(voters):
            return None
        return vote_guard.VoteFloor(max(a.term for a in answers), max(a.commit_index for a in answers), None)
    monkeypatch.setattr(sim_wipes, "floor_from", floor_from)


def _never_retired(monkeypatch):
    def caught_up(self, commit_index):  # noted, so the simulation wipes another node, but kept
        self.reached = self.reached or self.floor is not None and commit_index >= self.floor.index
    monkeypatch.setattr(vote_guard.VoteGuard, "reached", False, raising=False)
    monkeypatch.setattr(vote_guard.VoteGuard, "caught_up", caught_up)
    monkeypatch.setattr(vote_guard.VoteGuard, "recovering", property(
        lambda self: self.waiting or self.floor is not None and self.floor.index > 0 and not self.reached))


def _never_lowered(monkeypatch):
    monkeypatch.setattr(vote_guard.VoteGuard, "lower", lambda self, floor: False)


def _appends_while_waiting(monkeypatch):
    monkeypatch.setattr(vote_guard.VoteGuard, "admits_leader", lambda self, term: True)


def _guard_not_kept_until_settled(monkeypatch):
    def opened(self, folder, guarded):
        self._path = Path(folder) / vote_guard.FLOOR_FILE
        self.floor, self.waiting = vote_guard._read(self._path)
        self.waiting = self.waiting or guarded and self.floor is None
    monkeypatch.setattr(vote_guard.VoteGuard, "__init__", opened)


@pytest.mark.parametrize("options, seed, without, breaks", [
    (dict(replicas=3, faults=Faults(wipe=0.2, cluster_power=0.1)), 1, _one_answer, "leader completeness"),
    (dict(nodes=5, groups=8, fsync=True, faults=Faults(wipe=0.2)), 13, _commit_index_floor, "leader completeness"),
    (dict(replicas=3, faults=Faults(wipe=0.2, cluster_power=0.1)), 3, _never_retired, "no leader"),
    (dict(replicas=2, faults=Faults(wipe=0.2, cluster_power=0.1)), 1, _never_lowered, "no leader"),
    (dict(nodes=5, groups=8, fsync=True, faults=Faults(wipe=0.15)), 121, _appends_while_waiting, "state-machine"),
    (dict(replicas=3, faults=Faults(wipe=0.2, cluster_power=0.1)), 199, _guard_not_kept_until_settled,
     "leader completeness"),
], ids=["a-floor-from-every-majority", "the-most-up-to-date-log", "retired-once-caught-up",
        "lowered-when-no-log-holds-it", "no-append-while-the-term-is-forgotten", "kept-from-the-start"])
def test_a_wiped_voter_is_guarded_safely_and_its_group_settles(monkeypatch, options, seed, without, breaks):
    """Nodes wiped among the other faults (the chaos harness's restart:wipe): their voters open guarded
    (vote_guard). Each seed here broke Raft's safety, or left a group leaderless for good, without one part
    of the guard; with it, the run is safe and every group settles."""
    config = SimConfig(seed=seed, steps=20_000, **options)
    result = run(config)
    assert result.ok and not result.liveness, result.report(100)
    assert result.stats["wipes"] > 0 and result.stats["vote floors learned"] > 0
    without(monkeypatch)
    failed = run(config)
    assert any(breaks in line for line in failed.violations + failed.liveness), failed.report(40)
