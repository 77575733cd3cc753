"""Quiescence on node processes: an idle cluster rests, with a learner (pysyncobj's rest) or without (the
node engine's), and a resting partition whose leader's node freezes still elects a new leader and takes
writes (docs/raft-transport.md, docs/raft-engine.md "Resting in the engine")."""

from __future__ import annotations

import signal
import urllib.request

import pytest

from prometheus_client.parser import text_string_to_metric_families

from raftkv import Client
from tests.conftest import changelog_caught_up, wait_until

PARTITIONS = 8


def samples(cluster, node_id: str, name: str):
    node = cluster.spec.node(node_id)
    with urllib.request.urlopen(f"http://{node.host}:{node.metrics_port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == name]


def resting(cluster, node_id: str) -> dict[str, float]:
    """The node's `raftkv_group_resting` gauges, by partition label (the metadata group's too)."""
    return {sample.labels["partition"]: sample.value for sample in samples(cluster, node_id, "raftkv_group_resting")}


def all_rest(cluster, node_ids) -> bool:
    for node_id in node_ids:
        gauges = resting(cluster, node_id)
        if len(gauges) < PARTITIONS + 1 or set(gauges.values()) != {1.0}:
            return False
    return True


def engines_drive(cluster) -> bool:
    """Every node's engine drives settled groups: it starts to once the metadata says every member runs it,
    about a second after a new cluster is ready. A group idle before that rests in pysyncobj."""
    return all([s.value for s in samples(cluster, n, "raftkv_engine_on")] == [1.0] for n in cluster.spec.node_ids)


def engine_rests(cluster, node_ids) -> float:
    return sum(s.value for n in node_ids for s in samples(cluster, n, "raftkv_engine_rests_total"))


def leaders(endpoints: list[str]) -> dict[int, str]:
    with Client(endpoints, timeout=5) as kv:
        return {ps.partition: s.node_id for s in kv.status() for ps in s.partitions if ps.role == "leader"}


@pytest.mark.parametrize("with_learner", [True, False], ids=["a-learner-on-every-group", "resting-in-the-engine"])
def test_an_idle_cluster_rests_and_its_partitions_elect_when_a_resting_leaders_node_freezes(make_cluster,
                                                                                           changelog_learner,
                                                                                           with_learner):
    cluster = make_cluster(nodes=3, partitions=PARTITIONS)
    learner = changelog_learner(cluster) if with_learner else None
    wait_until(lambda: engines_drive(cluster), 30, "every node's engine to drive settled groups")
    nodes = cluster.spec.node_ids
    if learner:  # a member of every group: until its joining reached a group, the group rested in the engine
        wait_until(lambda: changelog_caught_up(cluster, learner), 60, "the learner to join every group")
    rested_before = engine_rests(cluster, nodes)
    written = {b"k%03d" % i: b"v%d" % i for i in range(200)}
    with Client(cluster.endpoints) as kv:
        for key, value in written.items():
            kv.put(key, value)
    if learner:
        wait_until(lambda: changelog_caught_up(cluster, learner), 60, "the learner to catch up")
    wait_until(lambda: all_rest(cluster, nodes), 30, "every group of every node to rest")
    rested_in_engine = engine_rests(cluster, nodes) - rested_before
    assert (rested_in_engine == 0) == with_learner, rested_in_engine  # groups with a learner rest in pysyncobj

    led = leaders(cluster.endpoints)
    frozen = max(nodes, key=lambda n: sum(1 for leader in led.values() if leader == n))
    others = [n for n in nodes if n != frozen]
    endpoints = [cluster.spec.node(n).api_address for n in others]
    cluster.signal(frozen, signal.SIGSTOP)  # no socket is closed: only the hub's pings can tell
    try:
        wait_until(lambda: set(leaders(endpoints).values()) <= set(others) and len(leaders(endpoints)) == PARTITIONS,
                   30, f"the partitions {frozen} led to elect leaders on {others}")
        later = {b"k%03d" % i: b"after" for i in range(200)}
        with Client(endpoints, timeout=20) as kv:
            for key, value in later.items():
                kv.put(key, value)
            assert dict(kv.scan(prefix=b"k")) == later
    finally:
        cluster.signal(frozen, signal.SIGCONT)
    if learner:
        wait_until(lambda: changelog_caught_up(cluster, learner), 60, "the learner to catch up again")
    wait_until(lambda: all_rest(cluster, nodes), 30, "every group to rest again once the node thawed")
