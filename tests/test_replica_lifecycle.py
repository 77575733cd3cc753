"""The replica lifecycle's pure decision: tables of what a node does as a move goes by, and properties
of any desired and local state (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftkv.core.spec import build_spec
from raftkv.meta.bootstrap import bootstrap_command
from raftkv.meta.records import META, AdvanceMove, BeginMove, ClusterMeta, EndMove, MoveStep, apply
from raftkv.node.replica_lifecycle import (CancelCopy, Desired, ForgetCopy, Local, OpenLearner, OpenVoter, Promote,
                                           RemoveLearner, RemoveVoter, ReopenMeta, StartCopy, after, reconcile)

F = frozenset


def _meta(tmp_path) -> ClusterMeta:
    spec = build_spec(nodes=4, partitions=4, replication=3, base_port=20000, data_dir=tmp_path)
    return apply(ClusterMeta(), bootstrap_command(spec))


def test_desired_follows_a_move_through_its_steps(tmp_path):
    meta = _meta(tmp_path)
    # partition p starts on the three nodes from n(p mod 4 + 1); the spec's first three vote on meta
    assert Desired.of(meta, "n4") == Desired(F({1, 2, 3}), F(), False)
    meta = apply(meta, BeginMove(0, "n1", "n4"))
    assert Desired.of(meta, "n4") == Desired(F({1, 2, 3}), F({0}), False)
    assert 0 in Desired.of(meta, "n1").voters
    meta = apply(meta, AdvanceMove(0, MoveStep.VOTING))
    assert Desired.of(meta, "n4") == Desired(F({0, 1, 2, 3}), F(), False)
    meta = apply(meta, EndMove(0, ("n4", "n2", "n3")))
    assert 0 not in Desired.of(meta, "n1").voters
    assert Desired.of(ClusterMeta(), "n9").meta_voter is None  # a node the metadata does not know yet


@pytest.mark.parametrize("desired, local, actions", [
    # start-up: every voter opens
    (Desired(F({0, 2})), Local(), [OpenVoter(0), OpenVoter(2)]),
    # a move here begins: no data, so a copy first; the copy ended: a learner on what it left
    (Desired(F(), F({1})), Local(empty=F({1})), [StartCopy(1)]),
    (Desired(F(), F({1})), Local(copied=F({1}), empty=F({1})), [OpenLearner(1)]),
    # data already here (a move back to a node that kept its folder): a learner at once
    (Desired(F(), F({1})), Local(), [OpenLearner(1)]),
    # nothing happens to a partition while its copy is under way
    (Desired(F(), F({1})), Local(copying=F({1}), copied=F({1})), []),
    (Desired(F({1})), Local(copying=F({1}), copied=F({1})), [ForgetCopy(1, delete=False)]),
    # the learner was added: promoted on the same data
    (Desired(F({1})), Local(learners=F({1})), [Promote(1)]),
    # the move ended without this node: the copy is cancelled and its data deleted; a learner removed
    (Desired(), Local(copying=F({1}), copied=F({1})), [CancelCopy(1), ForgetCopy(1, delete=True)]),
    (Desired(), Local(learners=F({1})), [RemoveLearner(1)]),
    # the replica moved away
    (Desired(F({0})), Local(voters=F({0, 3})), [RemoveVoter(3)]),
    # the metadata replica follows its voting first
    (Desired(F({0}), meta_voter=True), Local(voters=F({0}), meta_voter=False), [ReopenMeta(True)]),
    (Desired(F({0}), meta_voter=None), Local(voters=F({0}), meta_voter=False), []),
    (Desired(F({0}), meta_voter=False), Local(voters=F({0})), []),  # not open yet: nothing to reopen
])
def test_the_actions_that_close_the_gap(desired, local, actions):
    assert reconcile(desired, local) == actions


partitions = st.frozensets(st.integers(0, 5))


@st.composite
def states(draw):
    voters = draw(partitions)
    desired = Desired(voters, draw(partitions) - voters, draw(st.sampled_from([None, True, False])))
    local_voters = draw(partitions)
    copying = draw(partitions) - local_voters
    learners = draw(partitions) - local_voters - copying
    local = Local(local_voters, learners, copying, draw(partitions) | copying, draw(partitions),
                  draw(st.sampled_from([None, True, False])))
    return desired, local


@given(states())
def test_run_again_on_what_its_actions_leave_it_reaches_what_is_desired_and_asks_for_nothing_more(state):
    """Re-run, never resumed: each round runs the actions and lets the copies they started end. A voter
    here that the metadata makes a learner here (no rule allows that, but the decision must not loop)
    is deleted first, then copied afresh: three rounds at most."""
    desired, local = state
    for _ in range(3):
        local = after(local, reconcile(desired, local))
        local = Local(local.voters, local.learners, F(), local.copied, local.empty, local.meta_voter)
    assert reconcile(desired, local) == []
    assert local.voters == desired.voters
    assert local.learners == desired.learners
    assert local.meta_voter == (state[1].meta_voter if desired.meta_voter is None or state[1].meta_voter is None
                                else desired.meta_voter)


@given(states())
def test_a_partition_runs_one_way_and_nothing_wanted_or_copying_is_deleted(state):
    desired, local = state
    actions = reconcile(desired, local)
    now = after(local, actions)
    assert not now.voters & now.learners and not (now.voters | now.learners) & now.copying
    deleted = {a.partition for a in actions if isinstance(a, (RemoveVoter, RemoveLearner))
               or isinstance(a, ForgetCopy) and a.delete}
    assert not deleted & desired.voters
    assert not deleted & (desired.learners - local.voters)  # (a voter made a learner here starts afresh)
    promoted = {a.partition for a in actions if isinstance(a, Promote)}
    assert promoted <= local.learners and not promoted & deleted  # the learner's data becomes the voter's
    started = {a.partition for a in actions if isinstance(a, StartCopy)}
    assert started <= local.empty - local.copied  # a copy only into an empty folder, once


def test_the_metadata_group_is_never_a_partition(tmp_path):
    meta = apply(_meta(tmp_path), BeginMove(META, "", "n4"))
    assert Desired.of(meta, "n4").learners == F()
