"""Which nodes the metadata leader marks dead, up again, or removed (pure)."""

from __future__ import annotations

from dataclasses import replace

from raftkv.meta.liveness import verdicts
from raftkv.meta.records import ClusterMeta, NodeRecord, NodeState, SetNodeState


def meta_with(states: dict[str, NodeState], placement=(("n1", "n2", "n3"),)) -> ClusterMeta:
    nodes = tuple(NodeRecord(n, "h", 1, 2, 3, 4, state) for n, state in states.items())
    return ClusterMeta(epoch=5, replication=3, nodes=nodes, placement=placement, meta_voters=("n1",))


def test_a_node_silent_past_dead_after_is_dead_and_one_just_below_is_not():
    meta = meta_with({"n1": NodeState.UP, "n2": NodeState.UP, "n3": NodeState.DRAINING})
    assert verdicts(meta, {"n2": 10.5, "n3": 11.0}, {"n1"}, dead_after=10.0) == [
        SetNodeState("n2", NodeState.DEAD), SetNodeState("n3", NodeState.DEAD)]
    assert verdicts(meta, {"n2": 9.9}, {"n1", "n3"}, dead_after=10.0) == []


def test_a_dead_node_that_answers_is_up_again_and_a_silent_one_stays_dead():
    meta = meta_with({"n1": NodeState.UP, "n2": NodeState.UP, "n3": NodeState.UP, "n4": NodeState.DEAD})
    assert verdicts(meta, {"n4": 500.0}, {"n1", "n2", "n3"}, dead_after=10.0) == []
    assert verdicts(meta, {"n4": 0.0}, {"n4"}, dead_after=10.0) == [SetNodeState("n4", NodeState.UP)]


def test_a_draining_node_is_removed_once_it_holds_nothing():
    meta = meta_with({"n1": NodeState.UP, "n2": NodeState.UP, "n3": NodeState.UP, "n4": NodeState.DRAINING})
    assert verdicts(meta, {}, set(), dead_after=10.0) == [SetNodeState("n4", NodeState.REMOVED)]
    holding = replace(meta, placement=(("n1", "n2", "n4"),))
    assert verdicts(holding, {}, set(), dead_after=10.0) == []
