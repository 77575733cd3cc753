"""The placement planner: examples, and properties over random clusters (hypothesis)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from raftkv.core.partitioning import replicas_for
from raftkv.meta.planner import PlannedMove, PlannedTransfer, plan
from raftkv.meta.records import META, ClusterMeta, Move, NodeRecord, NodeState, meta_voter_count


def cluster(node_ids, partitions: int, rf: int, states=None, placement=None) -> ClusterMeta:
    states = states or {}
    nodes = tuple(NodeRecord(n, "127.0.0.1", 1, 2, 3, 4, states.get(n, NodeState.UP)) for n in node_ids)
    if placement is None:
        placement = tuple(replicas_for(p, node_ids, rf) for p in range(partitions))
    meta_voters = tuple(n for n in node_ids if states.get(n, NodeState.UP) == NodeState.UP)[:1]
    return ClusterMeta(epoch=1, replication=rf, nodes=nodes, placement=placement, meta_voters=meta_voters)


def of_partitions(actions: list) -> list:
    return [a for a in actions if a.partition != META]


def first_replicas_lead(meta: ClusterMeta) -> dict[int, str]:
    return {p: voters[0] for p, voters in enumerate(meta.placement)}


def test_a_balanced_cluster_needs_nothing():
    meta = cluster(["n1", "n2", "n3"], 8, 3)
    assert of_partitions(plan(meta, first_replicas_lead(meta))) == []


def test_new_nodes_get_replicas_from_the_most_loaded_within_the_limits():
    meta = cluster(["n1", "n2", "n3"], 6, 3)
    grown = replace(meta, nodes=meta.nodes + (NodeRecord("n4", "h", 1, 2, 3, 4), NodeRecord("n5", "h", 1, 2, 3, 4)))
    actions = of_partitions(plan(grown, first_replicas_lead(meta), max_moves=2))
    assert actions == [PlannedMove(0, "n3", "n4"), PlannedMove(1, "n2", "n5")]


def test_replicas_leave_draining_and_dead_nodes_first():
    meta = cluster(["n1", "n2", "n3", "n4"], 4, 3, states={"n1": NodeState.DRAINING})
    actions = of_partitions(plan(meta, {}, max_moves=3, max_moves_per_node=3))
    assert [a for a in actions if isinstance(a, PlannedMove)] == [
        PlannedMove(0, "n1", "n4"), PlannedMove(2, "n1", "n2"), PlannedMove(3, "n1", "n3")]


def test_moves_under_way_count_against_the_limits():
    meta = cluster(["n1", "n2", "n3", "n4"], 4, 3, states={"n1": NodeState.DEAD})
    moving = replace(meta, moves=(Move(0, "n1", "n4"), Move(2, "n1", "n2")))
    assert of_partitions(plan(moving, {}, max_moves=2)) == []
    assert of_partitions(plan(moving, {}, max_moves=3, max_moves_per_node=3)) == [PlannedMove(3, "n1", "n3")]


def test_the_metadata_group_grows_to_an_odd_count_and_leaves_draining_nodes():
    meta = cluster(["n1", "n2", "n3", "n4", "n5"], 4, 3)  # one metadata voter, n1
    assert plan(meta, first_replicas_lead(meta))[0] == PlannedMove(META, "", "n2")
    five = replace(meta, meta_voters=("n1", "n2", "n3", "n4", "n5"))
    assert [a for a in plan(five, first_replicas_lead(meta)) if a.partition == META] == []
    draining = replace(five, nodes=tuple(replace(n, state=NodeState.DRAINING) if n.id == "n2" else n
                                         for n in five.nodes))
    assert plan(draining, {})[0] == PlannedMove(META, "n2", "")  # no up node left to take its place
    three = replace(draining, meta_voters=("n1", "n2", "n3"))
    assert plan(three, {})[0] == PlannedMove(META, "n2", "n4")


def test_leaders_are_evened_out_by_transfers_to_voters():
    meta = cluster(["n1", "n2", "n3"], 6, 3)
    actions = of_partitions(plan(meta, {p: "n1" for p in range(6)}))
    assert all(isinstance(a, PlannedTransfer) and a.source == "n1" for a in actions)
    led = Counter({p: "n1" for p in range(6)}.values())
    for a in actions:
        led[a.source] -= 1
        led[a.target] += 1
    assert max(led.values()) - min(led.values()) <= 1


@st.composite
def clusters(draw):
    n = draw(st.integers(1, 7))
    node_ids = [f"n{i + 1}" for i in range(n)]
    rf = draw(st.integers(1, min(3, n)))
    partitions = draw(st.integers(1, 24))
    placement = tuple(tuple(draw(st.permutations(node_ids))[:rf]) for _ in range(partitions))
    extra = draw(st.integers(0, 2))  # nodes that just joined, holding nothing
    states = {}
    for node in node_ids:
        states[node] = draw(st.sampled_from([NodeState.UP] * 4 + [NodeState.DRAINING, NodeState.DEAD]))
    node_ids += [f"n{n + i + 1}" for i in range(extra)]
    up = [x for x in node_ids if states.get(x, NodeState.UP) == NodeState.UP]
    if len(up) < rf:
        states = {}
    leaders = {p: draw(st.sampled_from(voters)) for p, voters in enumerate(placement)}
    return cluster(node_ids, partitions, rf, states, placement), leaders


@settings(max_examples=300, deadline=None, derandomize=True)  # the same examples on every run: CI stays reproducible
@given(clusters(), st.integers(1, 4), st.integers(1, 3))
def test_repeated_plans_converge_and_never_break_a_rule(case, max_moves, per_node):
    meta, leaders = case
    up = {n.id for n in meta.nodes if n.state == NodeState.UP}
    for _ in range(200):
        actions = plan(meta, leaders, max_moves=max_moves, max_moves_per_node=per_node)
        if not actions:
            break
        moves = [a for a in actions if isinstance(a, PlannedMove) and a.partition != META]
        assert len(moves) <= max_moves
        assert len({m.partition for m in moves}) == len(moves)
        load = Counter([m.source for m in moves] + [m.target for m in moves])
        assert all(count <= per_node for count in load.values())
        placement = list(meta.placement)
        for a in actions:
            if isinstance(a, PlannedMove) and a.partition == META:
                assert len([b for b in actions if b.partition == META]) == 1
                assert not a.target or (a.target in up and a.target not in meta.meta_voters)
                voters = tuple(v for v in meta.meta_voters if v != a.source) + ((a.target,) if a.target else ())
                meta = replace(meta, meta_voters=voters)
            elif isinstance(a, PlannedMove):
                assert a.target in up and a.target not in placement[a.partition] and a.source in placement[a.partition]
                placement[a.partition] = tuple(a.target if v == a.source else v for v in placement[a.partition])
                if leaders.get(a.partition) == a.source:
                    leaders = {**leaders, a.partition: a.target}
            else:
                assert leaders[a.partition] == a.source and a.target in placement[a.partition]
                leaders = {**leaders, a.partition: a.target}
        assert all(len(set(v)) == len(v) for v in placement)
        meta = replace(meta, placement=tuple(placement))
    else:
        raise AssertionError("the plans did not converge in 200 rounds")
    held = Counter({n: 0 for n in up})
    held.update(v for voters in meta.placement for v in voters if v in up)
    assert max(held.values()) - min(held.values()) <= 1
    assert all(v in up for voters in meta.placement for v in voters)
    assert all(v in up for v in meta.meta_voters) and len(meta.meta_voters) >= meta_voter_count(len(up))
    led = Counter({n: 0 for n in up})
    led.update(leader for leader in leaders.values() if leader in up)
    assert max(led.values()) - min(led.values()) <= 1, (led, meta.placement, leaders)

