"""The metadata leader's own decisions (`rebalance_steps`): liveness from its polls and the plan's moves
and transfers, with a fake clock; and the cluster version it raises from what its polls hear."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from raftkv.api import kv_pb2 as pb
from raftkv.core.spec import Tuning, build_spec
from raftkv.meta.cluster_version import LearnerRelease
from raftkv.meta.bootstrap import bootstrap_command
from raftkv.meta.planner import PlannedTransfer
from raftkv.meta.records import BeginMove, ClusterMeta, NodeState, SetNodeState, apply
from raftkv.node.rebalance_steps import Watch, balance, heard, judge
from raftkv.node.rebalancer import Rebalancer

TUNING = Tuning(dead_after=10.0, election_timeout_max=1.0, max_moves=2, max_moves_per_node=1)
NODES = ("n1", "n2", "n3", "n4")


def _meta(tmp_path, nodes: int = 4) -> ClusterMeta:
    spec = build_spec(nodes=nodes, partitions=4, replication=3, base_port=20000, data_dir=tmp_path)
    return apply(ClusterMeta(), bootstrap_command(spec))


def _round(meta: ClusterMeta, watch: Watch, answered: set[str], now: float) -> tuple[ClusterMeta, Watch, list]:
    watch = heard(watch, [n.id for n in meta.nodes if n.state != NodeState.REMOVED], answered, now)
    changes = judge(meta, watch, answered, now, TUNING.dead_after)
    for change, _silent in changes:
        meta = apply(meta, change)
    return meta, watch, changes


def test_a_silent_node_is_dead_after_dead_after_and_up_again_when_it_answers(tmp_path):
    meta, watch = _meta(tmp_path), Watch()
    meta, watch, changes = _round(meta, watch, set(NODES), now=100.0)
    assert changes == []
    for now in (101.0, 105.0, 110.0):  # silent for exactly dead_after: not yet
        meta, watch, changes = _round(meta, watch, {"n1", "n2", "n3"}, now)
        assert changes == []
    meta, watch, changes = _round(meta, watch, {"n1", "n2", "n3"}, now=110.5)
    assert changes == [(SetNodeState("n4", NodeState.DEAD), 10.5)]
    meta, watch, changes = _round(meta, watch, set(NODES), now=200.0)
    assert changes == [(SetNodeState("n4", NodeState.UP), 0.0)]


def test_a_new_metadata_leader_starts_every_clock_afresh(tmp_path):
    """A node never heard of starts its clock at the first poll: a leader change delays a verdict."""
    meta = _meta(tmp_path)
    meta, watch, _ = _round(meta, Watch(), {"n1", "n2", "n3"}, now=500.0)  # n4 silent from the start
    meta, watch, changes = _round(meta, watch, {"n1", "n2", "n3"}, now=510.0)
    assert changes == []
    meta, watch, changes = _round(meta, watch, {"n1", "n2", "n3"}, now=510.1)
    assert [c for c, _ in changes] == [SetNodeState("n4", NodeState.DEAD)]


def test_a_dead_nodes_replicas_move_and_a_partitions_leader_is_asked_once_in_five_election_timeouts(tmp_path):
    meta = apply(_meta(tmp_path, nodes=5), SetNodeState("n1", NodeState.DEAD))
    actions, watch = balance(meta, {}, Watch(), now=0.0, tuning=TUNING)
    moves = [a for a in actions if isinstance(a, BeginMove)]
    assert moves and all(m.source == "n1" for m in moves if m.group >= 0)
    assert len([m for m in moves if m.group >= 0]) <= TUNING.max_moves
    # n2 leads three partitions, n3 to n5 none: leadership is evened out by transfers
    leaders = {0: "n1", 1: "n2", 2: "n2", 3: "n2"}
    meta = _meta(tmp_path, nodes=5)
    actions, watch = balance(meta, leaders, Watch(), now=0.0, tuning=TUNING)
    transfers = [a for a in actions if isinstance(a, PlannedTransfer)]
    assert transfers
    again, watch2 = balance(meta, leaders, watch, now=4.9, tuning=TUNING)
    assert not [a for a in again if isinstance(a, PlannedTransfer)]  # the last may not show yet
    later, _ = balance(meta, leaders, watch2, now=5.0, tuning=TUNING)
    assert [a for a in later if isinstance(a, PlannedTransfer)] == transfers


@settings(max_examples=50)
@given(st.lists(st.tuples(st.sets(st.sampled_from(NODES)), st.floats(0.0, 6.0)), max_size=40))
def test_no_node_is_dead_before_it_was_silent_dead_after_nor_stays_silent_past_it_undeclared(rounds):
    """Whatever the polls hear and however far apart: a verdict of dead is due exactly when the node's
    last answer (or first poll) is more than dead_after ago."""
    meta = apply(ClusterMeta(), bootstrap_command(build_spec(nodes=4, partitions=4, replication=3, base_port=20000,
                                                            data_dir="/nonexistent")))
    watch, now, last = Watch(), 0.0, {}
    for answered, pause in rounds:
        now += pause
        for node in NODES:
            last.setdefault(node, now)
            if node in answered:
                last[node] = now
        meta, watch, changes = _round(meta, watch, answered, now)
        dead = {c.node_id for c, _ in changes if c.state == NodeState.DEAD}
        for node in NODES:
            state = meta.node(node).state
            if node in dead:
                assert now - last[node] > TUNING.dead_after
            elif state != NodeState.DEAD:
                assert now - last[node] <= TUNING.dead_after


class _StatusOf:
    def __init__(self, reply: pb.StatusResponse):
        self._reply = reply

    async def Status(self, request: pb.StatusRequest, timeout: float) -> pb.StatusResponse:
        assert request.brief, "the poll asks for the brief answer"
        return self._reply


class _NodesOfReleases:
    """`Peers`' twin for the polls: each node's Status as the test sets it (nodes of two releases at once
    take two builds, and the decision is the metadata leader's alone)."""

    def __init__(self, replies: dict[str, pb.StatusResponse]):
        self.replies = replies

    def stub(self, node_id: str) -> _StatusOf:
        return _StatusOf(self.replies[node_id])


def _status(version: str, learners: tuple[str, ...], brief: bool = False) -> pb.StatusResponse:
    if brief:  # a node of this release
        return pb.StatusResponse(version=version, learners=learners)
    return pb.StatusResponse(version=version, hosted=[pb.PartitionStatus(  # a release before the brief answer
        partition=0, role="follower", learners=[pb.LearnerStatus(name=n) for n in learners])])


def _version_rounds(meta: list[ClusterMeta], nodes: _NodesOfReleases) -> Callable[[float], str]:
    """A round of the metadata leader's duties at a time, which returns the cluster version after it."""
    async def change(command) -> None:
        meta[0] = apply(meta[0], command)

    rebalancer = Rebalancer(TUNING, lambda: meta[0], nodes, change)

    def round_at(now: float) -> str:
        asyncio.run(rebalancer.run_once(rebalance=False, now=now))
        return meta[0].cluster_version

    return round_at


def test_the_version_rises_no_higher_than_a_registered_learners_release(tmp_path):
    meta = [replace(_meta(tmp_path, nodes=3), cluster_version="0.3.0")]
    nodes = _NodesOfReleases({n: _status("0.5.0", ("feed",)) for n in ("n1", "n2", "n3")})
    round_at = _version_rounds(meta, nodes)

    assert round_at(1.0) == "0.3.0"  # feed is registered and has not said which release it runs
    meta[0] = apply(meta[0], LearnerRelease("feed", "0.4.0"))
    assert round_at(2.0) == "0.4.0"
    meta[0] = apply(meta[0], LearnerRelease("feed", "0.6.0"))
    assert round_at(3.0) == "0.5.0"  # the nodes' now
    nodes.replies = {n: _status("0.7.0", ()) for n in ("n1", "n2", "n3")}  # feed removed: its record no longer counts
    meta[0] = apply(meta[0], LearnerRelease("feed", "0.5.0"))
    assert round_at(4.0) == "0.7.0"


def test_learners_count_whether_a_node_answers_briefly_or_in_full_as_an_older_release_does(tmp_path):
    meta = [replace(_meta(tmp_path, nodes=3), cluster_version="0.3.0")]
    nodes = _NodesOfReleases({"n1": _status("0.5.0", ("feed",), brief=True), "n2": _status("0.5.0", ("audit",)),
                              "n3": _status("0.5.0", (), brief=True)})
    round_at = _version_rounds(meta, nodes)
    meta[0] = apply(meta[0], LearnerRelease("feed", "0.4.0"))
    assert round_at(1.0) == "0.3.0"  # audit, named in n2's full answer only, has not said which release it runs
    meta[0] = apply(meta[0], LearnerRelease("audit", "0.5.0"))
    assert round_at(2.0) == "0.4.0"  # feed, named in n1's brief answer only
