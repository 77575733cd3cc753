"""The cluster version (raftkv/meta/cluster_version.py): pure, no cluster."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from learners.release_report import check_release
from raftkv.core.errors import ChangeRefused, ConfigError
from raftkv.meta.cluster_version import (FIRST_RELEASE, LEARNER_RELEASES_SINCE, LearnerRelease, RaiseClusterVersion,
                                         at_least, refusal, version_to_raise)
from raftkv.meta.records import (ClusterMeta, NodeRecord, NodeState, apply, decode_command, decode_meta,
                                 encode_command, encode_meta)
from raftkv.security.permissions import Identity, Request, check

NODES = ("n1", "n2", "n3")


def meta(*states: NodeState) -> ClusterMeta:
    nodes = tuple(NodeRecord(n, "127.0.0.1", 7000 + 10 * i, 1, 2, 3, state)
                  for i, (n, state) in enumerate(zip(NODES, states or (NodeState.UP,) * 3)))
    return ClusterMeta(epoch=5, replication=3, nodes=nodes, placement=(NODES,), meta_voters=NODES)


def test_the_version_rises_to_the_lowest_release_once_every_member_answered():
    m = meta()
    assert version_to_raise(m.cluster_version, m.members, {"n1": "0.2.0", "n2": "0.3.0"}) is None  # n3 silent
    raise_ = version_to_raise(m.cluster_version, m.members, {"n1": "0.2.0", "n2": "0.3.0", "n3": "0.2.1"})
    assert raise_ == RaiseClusterVersion("0.2.0", (("n1", "0.2.0"), ("n2", "0.3.0"), ("n3", "0.2.1")))
    after = apply(m, raise_)
    assert after.cluster_version == "0.2.0" and after.epoch == m.epoch + 1
    assert version_to_raise(after.cluster_version, after.members, dict(raise_.releases)) is None  # nothing above


def test_a_member_of_the_first_release_reports_no_version_and_holds_the_cluster_back():
    m = meta()
    assert version_to_raise(m.cluster_version, m.members, {"n1": "0.2.0", "n2": "0.2.0", "n3": ""}) is None
    assert version_to_raise(m.cluster_version, m.members, {"n1": "0.2.0", "n2": "0.2.0", "n3": "nonsense"}) is None


def test_a_removed_node_does_not_count_and_a_dead_one_does():
    m = meta(NodeState.UP, NodeState.UP, NodeState.REMOVED)
    assert version_to_raise(m.cluster_version, m.members, {"n1": "0.2.0", "n2": "0.2.0"}).version == "0.2.0"
    m = meta(NodeState.UP, NodeState.UP, NodeState.DEAD)
    assert version_to_raise(m.cluster_version, m.members, {"n1": "0.2.0", "n2": "0.2.0"}) is None


@pytest.mark.parametrize("command, message", [
    (RaiseClusterVersion("0.0.9", tuple((n, "0.2.0") for n in NODES)), "never goes down"),
    (RaiseClusterVersion("0.3.0", (("n1", "0.3.0"), ("n2", "0.3.0"), ("n3", "0.2.0"))), "n3 runs 0.2.0"),
    (RaiseClusterVersion("0.3.0", (("n1", "0.3.0"), ("n2", "0.3.0"))), "n3 runs an unknown release"),
    (RaiseClusterVersion("x.y", tuple((n, "x.y") for n in NODES)), "'x.y' is not a release"),
])
def test_a_raise_the_members_do_not_bear_out_is_refused(command, message):
    with pytest.raises(ChangeRefused, match=message):
        apply(replace(meta(), cluster_version="0.1.0"), command)


def test_the_version_travels_in_the_metadata_and_metadata_of_the_first_release_has_the_first():
    m = replace(meta(), cluster_version="0.2.0")
    assert decode_meta(encode_meta(m)) == m
    old = json.loads(encode_meta(m))
    del old["cluster_version"]
    assert decode_meta(json.dumps(old).encode()).cluster_version == FIRST_RELEASE
    command = RaiseClusterVersion("0.2.0", tuple((n, "0.2.0") for n in NODES))
    assert decode_command(encode_command(command)) == command


def test_an_older_node_is_refused_in_one_line_and_features_wait_for_the_version():
    assert refusal("0.2.0", "0.2.0") is None and refusal("0.2.0", "0.3.0") is None
    line = refusal("0.3.0", "0.2.0")
    assert line.splitlines() == [line] and "raftkv 0.2.0, older than the cluster version 0.3.0" in line
    assert refusal("0.2.0", "0.2.0.dev0") is not None  # a development build comes before its release
    assert at_least("0.2.0", "0.2.0") and not at_least(FIRST_RELEASE, "0.2.0")


def test_a_registered_learner_holds_the_version_at_its_release_once_learners_report():
    nodes = {n: "0.3.0" for n in NODES}
    assert version_to_raise("0.2.0", NODES, nodes, {"feed": "0.2.0"}) is None  # the learner reads 0.2.0 formats
    assert version_to_raise("0.2.0", NODES, nodes, {"feed": None}) is None  # registered, not heard from
    assert version_to_raise("0.2.0", NODES, nodes, {"feed": "0.3.1"}).version == "0.3.0"
    two = {"feed": "0.3.1", "old": "0.3.0"}
    assert version_to_raise("0.2.0", NODES, {**nodes, "n1": "0.4.0"}, two).version == "0.3.0"
    # Below LEARNER_RELEASES_SINCE no learner can have reported: one that has not does not hold the version.
    assert version_to_raise(FIRST_RELEASE, NODES, nodes, {"feed": None}).version == "0.3.0"
    assert version_to_raise(FIRST_RELEASE, NODES, nodes, {"feed": "0.2.0"}).version == "0.2.0"


def test_a_learner_reports_its_release_once_every_member_can_apply_the_command():
    m = meta()
    with pytest.raises(ChangeRefused, match=f"learners report their release from {LEARNER_RELEASES_SINCE} on"):
        apply(m, LearnerRelease("feed", "0.3.0"))
    m = replace(m, cluster_version="0.3.0")
    after = apply(apply(apply(m, LearnerRelease("feed", "0.3.0")), LearnerRelease("audit", "0.3.1")),
                  LearnerRelease("feed", "0.4.0"))
    assert after.learner_releases == (("audit", "0.3.1"), ("feed", "0.4.0")) and after.epoch == m.epoch + 3
    with pytest.raises(ChangeRefused, match="learner old runs raftkv 0.2.0, older than the cluster version 0.3.0"):
        apply(m, LearnerRelease("old", "0.2.0"))
    assert decode_meta(encode_meta(after)) == after
    assert decode_command(encode_command(LearnerRelease("feed", "0.4.0"))) == LearnerRelease("feed", "0.4.0")
    learner = Identity("learner", "learner")
    assert check(learner, [Request.admin("report_release")], {}, {}) is None
    assert "may not run change_topology" in check(learner, [Request.admin("change_topology")], {}, {})


def test_a_learner_older_than_the_cluster_version_does_not_start_and_says_so_in_one_line():
    check_release(replace(meta(), cluster_version="0.3.0"), release="0.3.0")
    with pytest.raises(ConfigError) as refused:
        check_release(replace(meta(), cluster_version="0.3.0"), release="0.2.0")
    line = str(refused.value)
    assert line.splitlines() == [line] and "this learner runs raftkv 0.2.0, older than the cluster version 0.3.0" in line
