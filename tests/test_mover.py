"""A replica move's steps: the pure decision (`move_steps`) with a fake clock and made-up observations,
and ReplicaMover against a recorded move with the nodes' answers faked: no processes, no timing."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftkv.api import kv_pb2 as pb
from raftkv.core.errors import ChangeRefused, Unavailable
from raftkv.core.spec import build_spec
from raftkv.meta.bootstrap import bootstrap_command
from raftkv.meta.records import (META, AdvanceMove, BeginMove, ClusterMeta, EndMove, MoveStep, NodeState,
                                 SetNodeState, apply)
from raftkv.node.move_steps import (RESEED_SECONDS, ChangeMember, Compact, Need, Observed, Progress, Record, Reseed,
                                    Say, Stall, Verdict, begin, decide, needs)
from raftkv.node.mover import MoveSuperseded, ReplicaMover, on_leader

TIMEOUT = 60.0


class _Admin:
    def __init__(self, state: pb.ReplicaState):
        self._state = state

    async def ReplicaProgress(self, request, timeout=None) -> pb.ReplicaState:
        return self._state


class _Peers:
    """Every node answers that it is a caught-up voter of the group."""

    def admin(self, node_id: str) -> _Admin:
        return _Admin(pb.ReplicaState(mode="voter", applied_index=100, commit_index=100))


class _Leader:
    is_leader = True


def _meta(tmp_path, nodes: int = 4) -> ClusterMeta:
    spec = build_spec(nodes=nodes, partitions=4, replication=3, base_port=20000, data_dir=tmp_path)
    return apply(ClusterMeta(), bootstrap_command(spec))


def test_a_step_waiting_on_a_record_another_mover_advanced_gives_way(tmp_path):
    """Found by the decommission test: the metadata leadership moved while the old leader's mover was
    adding partition 3's new replica. The new leader's mover had read the move at `catching_up` and
    waited for the target to report itself a caught-up learner; the old one added it and recorded
    `voting`, so the target became a voter, never reported `learner` again, and the decommission
    waited forever."""
    meta = apply(_meta(tmp_path), BeginMove(0, "n1", "n4"))
    stale = meta.move_of(0)
    meta = apply(meta, AdvanceMove(0, MoveStep.VOTING))  # what the old leader's mover did meanwhile
    mover = ReplicaMover(lambda: _Leader(), lambda: meta, _Peers(), move_timeout=300.0)
    with pytest.raises(MoveSuperseded):
        asyncio.run(asyncio.wait_for(mover._step(begin(stale, 0.0)), 10))


def _learner(applied: int, received: int = 0) -> Progress:
    return Progress("learner", applied, received)


def _check(stall: Stall, target: Progress, commit: int, now: float) -> tuple[Stall, Verdict]:
    return stall.check(target, commit, now, TIMEOUT)


def test_a_learner_without_progress_while_the_group_commits_is_started_afresh_then_the_move_stalls():
    stall, verdict = _check(Stall(0.0), _learner(10), commit=100, now=0.0)
    assert verdict == Verdict.WAIT
    stall, verdict = _check(stall, _learner(10), commit=500, now=RESEED_SECONDS)
    assert verdict == Verdict.WAIT  # not yet: exactly the limit
    stall, verdict = _check(stall, _learner(10), commit=600, now=RESEED_SECONDS + 0.1)
    assert verdict == Verdict.RESEED
    stall, verdict = _check(stall, _learner(10), commit=600, now=RESEED_SECONDS + 0.2)
    assert verdict == Verdict.WAIT  # asked once per stall
    stall, verdict = _check(stall, _learner(10), commit=601, now=RESEED_SECONDS + 0.3)
    assert verdict == Verdict.RESEED  # ... and again while it goes on
    stall, verdict = _check(stall, _learner(10), commit=700, now=60.1)
    assert verdict == Verdict.STALLED
    assert stall.why("n4", TIMEOUT, 700) == "n4 made no progress for 60s (applied index 10 of 700)"


def test_a_learner_that_progresses_or_a_group_that_commits_nothing_is_left_alone():
    stall = Stall(0.0)
    for second in range(1, 30):  # bytes of a snapshot arriving count as progress
        stall, verdict = _check(stall, _learner(10, received=second), commit=100 * second, now=float(second))
        assert verdict == Verdict.WAIT
    idle, verdict = _check(Stall(0.0), _learner(10), commit=100, now=0.0)
    assert verdict == Verdict.WAIT
    assert _check(idle, _learner(10), commit=100, now=30.0)[1] == Verdict.WAIT  # nothing to catch up on


def _voter(applied: int) -> Progress:
    return Progress("voter", applied)


def test_a_move_from_copy_to_end(tmp_path):
    meta = apply(_meta(tmp_path), BeginMove(0, "n1", "n4"))
    memory = begin(meta.move_of(0), now=0.0)
    assert needs(meta, memory) == Need.TARGET
    step = decide(meta, memory, Observed(Progress("copying", snapshot_bytes=1000)), 0.2, TIMEOUT)
    assert step.actions == () and step.wait
    step = decide(meta, step.memory, Observed(_learner(0)), 0.4, TIMEOUT)
    assert step.actions == (Compact(),) and not step.wait  # nothing was copied: the leader snapshots
    assert needs(meta, step.memory) == Need.TARGET_AND_VOTERS
    step = decide(meta, step.memory, Observed(_learner(10), commit=500), 0.6, TIMEOUT)
    assert step.actions == () and step.wait
    step = decide(meta, step.memory, Observed(_learner(436), commit=500), 0.8, TIMEOUT)  # within 64 entries
    assert step.actions == (ChangeMember(True, "n4"), Record(AdvanceMove(0, MoveStep.VOTING)),
                            Say("partition 0: n4 added to the group"))
    meta = apply(meta, AdvanceMove(0, MoveStep.VOTING))
    memory = begin(meta.move_of(0), now=1.0)
    step = decide(meta, memory, Observed(_learner(500), commit=500), 1.2, TIMEOUT)
    assert step.wait  # not a voter yet
    step = decide(meta, step.memory, Observed(_voter(500), commit=500), 1.4, TIMEOUT)
    assert step.actions == () and not step.wait and needs(meta, step.memory) == Need.NOTHING
    step = decide(meta, step.memory, Observed(), 1.4, TIMEOUT)
    assert step.actions == (ChangeMember(False, "n1"), Record(EndMove(0, ("n4", "n2", "n3"))),
                            Say("partition 0: moved from n1 to n4; voters n4, n2, n3"))


def test_a_dead_source_is_removed_first_and_a_dead_target_ends_the_move(tmp_path):
    meta = apply(apply(_meta(tmp_path), BeginMove(0, "n1", "n4")), SetNodeState("n1", NodeState.DEAD))
    memory = begin(meta.move_of(0), now=0.0)
    assert needs(meta, memory) == Need.NOTHING
    step = decide(meta, memory, Observed(), 0.0, TIMEOUT)
    assert step.actions == (ChangeMember(False, "n1"),)
    assert needs(meta, step.memory) == Need.TARGET  # once
    meta = apply(meta, SetNodeState("n4", NodeState.DEAD))
    step = decide(meta, step.memory, Observed(), 0.2, TIMEOUT)
    assert step.actions == (ChangeMember(False, "n4"), Record(EndMove(0, ("n1", "n2", "n3"))),
                            Say("partition 0: move to n4 abandoned: n4 is dead", warning=True))


def test_a_learner_without_progress_is_reseeded_then_the_move_is_abandoned(tmp_path):
    meta = apply(_meta(tmp_path), BeginMove(0, "n1", "n4"))
    step = decide(meta, begin(meta.move_of(0), now=0.0), Observed(_learner(7)), 0.0, TIMEOUT)
    memory, now, reseeds = step.memory, 0.0, []
    while True:
        now = round(now + 0.2, 1)
        commit = 100 + int(now * 10)
        step = decide(meta, memory, Observed(_learner(7), commit=commit), now, TIMEOUT)
        if Reseed() in step.actions:
            reseeds.append(now)
        memory = step.memory
        if any(isinstance(a, Record) for a in step.actions):
            break
    # its progress was first seen at 0.2 s: reseeded once it stood still for more than RESEED_SECONDS, then
    # at every poll while the group commits and it does not move; abandoned after more than TIMEOUT
    assert reseeds[:2] == pytest.approx([0.2 + RESEED_SECONDS + 0.2, 0.2 + RESEED_SECONDS + 0.4])
    assert now == pytest.approx(0.2 + TIMEOUT + 0.2)
    assert step.actions[-1] == Say("partition 0: move to n4 abandoned: n4 made no progress for 60s "
                                   f"(applied index 7 of {commit})", warning=True)


def test_the_metadata_groups_source_leaves_as_a_learner_before_it_is_removed(tmp_path):
    meta = apply(_meta(tmp_path), BeginMove(META, "n1", "n4"))
    memory = begin(meta.move_of(META), now=0.0)
    assert needs(meta, memory) == Need.TARGET_AND_VOTERS  # it copies nothing: straight to catching up
    meta = apply(meta, AdvanceMove(META, MoveStep.VOTING))
    step = decide(meta, begin(meta.move_of(META), 0.0), Observed(_voter(9), commit=9), 0.0, TIMEOUT)
    step = decide(meta, step.memory, Observed(), 0.0, TIMEOUT)
    assert step.actions == (Record(AdvanceMove(META, MoveStep.LEAVING)),)
    meta = apply(meta, AdvanceMove(META, MoveStep.LEAVING))
    step = decide(meta, begin(meta.move_of(META), 0.0), Observed(), 0.0, TIMEOUT)
    assert step.actions[:2] == (ChangeMember(False, "n1"), Record(EndMove(META, ("n4", "n2", "n3"))))


progress = st.one_of(st.none(), st.builds(Progress, st.sampled_from(["copying", "learner", "voter"]),
                                          st.integers(0, 100), st.integers(0, 3)))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(progress, st.integers(0, 100), st.floats(0.0, 20.0)), max_size=60),
       st.sampled_from([0, META]), st.booleans())
def test_whatever_it_observes_a_move_keeps_the_rules(tmp_path_factory, observations, group, dead_source):
    """Every recorded step is one the metadata accepts; a target is added only when it was seen a
    caught-up learner, the source removed only when the target was seen a caught-up voter (or the
    source is dead); the voters at the end are three distinct nodes."""
    meta = apply(_meta(tmp_path_factory.mktemp("m")), BeginMove(group, "n1", "n4"))
    if dead_source:
        meta = apply(meta, SetNodeState("n1", NodeState.DEAD))
    memory, now = begin(meta.move_of(group), 0.0), 0.0
    for target, commit, pause in observations:
        now += pause
        observed = Observed() if needs(meta, memory) == Need.NOTHING else Observed(target, commit)
        step = decide(meta, memory, observed, now, TIMEOUT)
        for action in step.actions:
            if isinstance(action, ChangeMember) and action.add:
                assert target.mode == "learner" and target.applied_index + 64 >= commit > 0
            if isinstance(action, ChangeMember) and not action.add and action.node == "n1" and not dead_source:
                assert memory.awaiting is None or memory.move.step == MoveStep.LEAVING
            if isinstance(action, Record):
                try:
                    meta = apply(meta, action.command)
                except ChangeRefused as refused:
                    pytest.fail(f"{action.command}: {refused}")
                if isinstance(action.command, EndMove):
                    assert len(set(action.command.voters)) == 3
        move = meta.move_of(group)
        if move is None:
            return
        memory = begin(move, now) if move != step.memory.move else step.memory


class _Voters:
    """Voters that answer a membership change as `answers` says: node id -> (done, leader hint)."""

    def __init__(self, answers: dict[str, tuple[bool, str]]):
        self.answers = answers
        self.asked: list[str] = []

    def admin(self, node_id: str):
        voters = self

        class Admin:
            async def ChangeMembership(self, request, timeout=None) -> pb.ChangeMembershipResponse:
                voters.asked.append(node_id)
                done, leader = voters.answers[node_id]
                return pb.ChangeMembershipResponse(done=done, leader=leader)

        return Admin()


def test_a_voter_that_knows_no_leader_does_not_hide_the_one_that_leads():
    """Found by the 35-minute lose-last-second soak (docs/chaos.md): a move of partition 1 from n8, marked
    dead, removed n8 first; n8 came back, and as a removed member it campaigned for good, knowing no
    leader. It was the first of the group's voters, and the call stopped at the first voter that
    answered: it asked n8 again every 0.2s for six minutes and never the leader behind it."""
    voters = _Voters({"n8": (False, ""), "n1": (False, "n9"), "n9": (True, "n9")})
    asyncio.run(on_leader(voters, lambda: ("n8", "n1", "n9"),
                          lambda admin: admin.ChangeMembership(pb.ChangeMembershipRequest()), "remove n8", timeout=2.0))
    assert voters.asked == ["n8", "n1", "n9"]


def test_a_leader_that_refuses_for_now_is_asked_again_first():
    voters = _Voters({"n1": (False, "n2"), "n2": (False, "n2"), "n3": (False, "")})
    with pytest.raises(Unavailable, match="not done within 1s"):
        asyncio.run(on_leader(voters, lambda: ("n1", "n2", "n3"),
                              lambda admin: admin.ChangeMembership(pb.ChangeMembershipRequest()), "add n4",
                              timeout=1.0))
    assert voters.asked[:4] == ["n1", "n2", "n2", "n2"] and "n3" not in voters.asked
