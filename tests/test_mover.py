"""ReplicaMover's steps against a recorded move, with the nodes' answers faked: no processes, no timing."""

from __future__ import annotations

import asyncio

import pytest

from raftkv.api import kv_pb2 as pb
from raftkv.core.spec import build_spec
from raftkv.meta.bootstrap import bootstrap_command
from raftkv.meta.records import AdvanceMove, BeginMove, ClusterMeta, MoveStep, apply
from raftkv.node.mover import RESEED_SECONDS, MoveStalled, MoveSuperseded, ReplicaMover, _Stall


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


def test_a_step_waiting_on_a_record_another_mover_advanced_gives_way(tmp_path):
    """Found by the decommission test: the metadata leadership moved while the old leader's mover was
    adding partition 3's new replica. The new leader's mover had read the move at `catching_up` and
    waited for the target to report itself a caught-up learner; the old one added it and recorded
    `voting`, so the target became a voter, never reported `learner` again, and the decommission
    waited forever."""
    spec = build_spec(nodes=4, partitions=4, replication=3, base_port=20000, data_dir=tmp_path)
    meta = apply(apply(ClusterMeta(), bootstrap_command(spec)), BeginMove(0, "n1", "n4"))
    stale = meta.move_of(0)
    meta = apply(meta, AdvanceMove(0, MoveStep.VOTING))  # what the old leader's mover did meanwhile
    mover = ReplicaMover(lambda: _Leader(), lambda: meta, _Peers(), move_timeout=300.0)
    with pytest.raises(MoveSuperseded):
        asyncio.run(asyncio.wait_for(mover._step(stale), 10))


def _learner(applied: int, received: int = 0) -> pb.ReplicaState:
    return pb.ReplicaState(mode="learner", applied_index=applied, snapshot_bytes_received=received)


def test_a_learner_without_progress_while_the_group_commits_is_started_afresh_then_the_move_stalls():
    stall = _Stall("n4", timeout=60.0, now=0.0)
    assert not stall.check(_learner(10), commit=100, now=0.0)
    assert not stall.check(_learner(10), commit=500, now=RESEED_SECONDS)  # not yet: exactly the limit
    assert stall.check(_learner(10), commit=600, now=RESEED_SECONDS + 0.1)
    assert not stall.check(_learner(10), commit=600, now=RESEED_SECONDS + 0.2)  # asked once per stall
    assert stall.check(_learner(10), commit=601, now=RESEED_SECONDS + 0.3)  # ... and again while it goes on
    with pytest.raises(MoveStalled, match="n4 made no progress for 60s"):
        stall.check(_learner(10), commit=700, now=60.1)


def test_a_learner_that_progresses_or_a_group_that_commits_nothing_is_left_alone():
    stall = _Stall("n4", timeout=60.0, now=0.0)
    for second in range(1, 30):  # bytes of a snapshot arriving count as progress
        assert not stall.check(_learner(10, received=second), commit=100 * second, now=float(second))
    idle = _Stall("n4", timeout=60.0, now=0.0)
    assert not idle.check(_learner(10), commit=100, now=0.0)
    assert not idle.check(_learner(10), commit=100, now=30.0)  # nothing to catch up on: nothing is wrong
